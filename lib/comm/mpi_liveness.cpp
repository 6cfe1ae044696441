// mpi_liveness.cpp: the responder thread and the question, point to point on a duplicate of MPI_COMM_WORLD.
#include "comm/mpi_liveness.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>

#include <unistd.h>
#include <vector>

namespace mt {
namespace {

constexpr int kQuestion = 1, kAnswer = 2, kAnswerBytes = 200;
MPI_Comm g_comm = MPI_COMM_NULL;
std::atomic<bool> g_stop{false};
bool g_closed = false;  // under g_ask: MPI is being finalised, no more questions
std::thread g_responder;
std::mutex g_ask;  // one question at a time per rank
constexpr int kWhereBytes = 96;
std::vector<char> g_where;  // each rank's "host H, pid P", gathered at the start

}  // namespace

void start_liveness_responder(std::function<std::string()> describe_self) {
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE || g_comm != MPI_COMM_NULL) return;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &g_comm) != MPI_SUCCESS) {
    g_comm = MPI_COMM_NULL;
    return;
  }
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  // Where each rank runs, so that a rank that cannot answer can still be found.
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  char mine[kWhereBytes] = {};
  std::snprintf(mine, sizeof(mine), "host %.60s, pid %ld", host, static_cast<long>(getpid()));
  int size = 1;
  MPI_Comm_size(g_comm, &size);
  g_where.assign(static_cast<size_t>(size) * kWhereBytes, 0);
  MPI_Allgather(mine, kWhereBytes, MPI_CHAR, g_where.data(), kWhereBytes, MPI_CHAR, g_comm);
  g_responder = std::thread([describe = std::move(describe_self)] {
    while (!g_stop.load()) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kQuestion, g_comm, &flag, &st) != MPI_SUCCESS) return;
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      int question = 0;
      MPI_Recv(&question, 1, MPI_INT, st.MPI_SOURCE, kQuestion, g_comm, MPI_STATUS_IGNORE);
      char answer[kAnswerBytes] = {};
      const std::string text = describe();
      std::strncpy(answer, text.c_str(), kAnswerBytes - 1);
      MPI_Request req;
      MPI_Isend(answer, kAnswerBytes, MPI_CHAR, st.MPI_SOURCE, kAnswer, g_comm, &req);
      // The asker is waiting for it (or has aborted the job): completes at once for so small a message.
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
  });
}

std::string ask_other_ranks(double seconds) {
  if (g_comm == MPI_COMM_NULL) return "";
  std::lock_guard<std::mutex> lock(g_ask);
  if (g_closed) return "";
  int me = 0, size = 1;
  MPI_Comm_rank(g_comm, &me);
  MPI_Comm_size(g_comm, &size);
  static int question = 0;
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    MPI_Request req;
    MPI_Isend(&question, 1, MPI_INT, r, kQuestion, g_comm, &req);
    MPI_Request_free(&req);  // a stopped rank never takes it
  }
  std::vector<std::string> answers(static_cast<size_t>(size));
  int pending = size - 1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kAnswer, g_comm, &flag, &st) != MPI_SUCCESS) break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    char answer[kAnswerBytes] = {};
    MPI_Recv(answer, kAnswerBytes, MPI_CHAR, st.MPI_SOURCE, kAnswer, g_comm, MPI_STATUS_IGNORE);
    answer[kAnswerBytes - 1] = 0;
    if (answers[static_cast<size_t>(st.MPI_SOURCE)].empty()) --pending;
    answers[static_cast<size_t>(st.MPI_SOURCE)] = answer[0] ? answer : "answering";
  }
  std::string silent, busy;
  int n_silent = 0;
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    const std::string& a = answers[static_cast<size_t>(r)];
    if (a.empty()) {
      std::string where(g_where.data() + static_cast<size_t>(r) * kWhereBytes, strnlen(g_where.data() + static_cast<size_t>(r) * kWhereBytes, kWhereBytes));
      silent += (silent.empty() ? "" : ", ") + std::to_string(r) + " (" + where + ")";
      ++n_silent;
    } else {
      busy += (busy.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " + a;
    }
  }
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.0f", seconds);
  std::string out;
  if (!silent.empty()) {
    out = std::string(n_silent > 1 ? "world ranks " : "world rank ") + silent + " did not answer within " + secs +
          " s (stopped, frozen, gone or already finished: look there)";
  } else {
    out = "every other rank answered (one is stuck outside this collective)";
  }
  if (!busy.empty()) out += "; " + busy;
  return out;
}

void stop_liveness_responder() {
  if (g_comm == MPI_COMM_NULL) return;
  {
    std::lock_guard<std::mutex> lock(g_ask);  // a question under way ends first
    g_closed = true;
  }
  g_stop = true;
  if (g_responder.joinable()) g_responder.join();
}

}  // namespace mt
