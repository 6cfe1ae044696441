// mpi_communicator.cpp: MPI collectives (chunked below 2^31 elements), group construction, watchdog.
#include "comm/mpi_communicator.h"
#include "comm/mpi_liveness.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace mt {
namespace {

constexpr int64_t kChunk = INT_MAX / 2;

std::atomic<int64_t> g_since_ns{0};       // when the collective in flight started (0: none)
std::atomic<const char*> g_op{""};
std::string g_group_name;                // guarded by g_mu
std::mutex g_mu;
std::atomic<int64_t> g_world_rank{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Marks a collective in flight for the watchdog.
class InFlight {
 public:
  InFlight(const char* op, const std::string& group, bool watched = true) : watched_(watched) {
    if (!watched_) return;
    g_op = op;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_group_name = group;
    }
    g_since_ns = now_ns();
  }
  ~InFlight() {
    if (watched_) g_since_ns = 0;
  }

 private:
  bool watched_;
};

std::atomic<bool> g_thread_multiple{false};

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string("MPI ") + what + " failed: " + std::string(msg, static_cast<size_t>(len)));
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

template <typename T>
void scale(T* data, int64_t n, double s) {
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] * s);
}

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(std::vector<MPI_Request> reqs, std::string group, std::function<void()> after)
      : reqs_(std::move(reqs)), group_(std::move(group)), after_(std::move(after)) {}
  ~MpiRequest() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {
      }
    }
  }
  void wait() override {
    if (done_) return;
    InFlight guard("wait", group_);
    check(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "Waitall");
    done_ = true;
    if (after_) after_();
  }

 private:
  std::vector<MPI_Request> reqs_;
  std::string group_;
  std::function<void()> after_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool watched)
    : comm_(comm), name_(std::move(name)), watched_(watched) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

template <typename T>
void MpiCommunicator::all_reduce_impl(T* data, int64_t n, ReduceOp op, MPI_Datatype type) {
  if (size_ == 1) return;
  InFlight guard("all-reduce", name_, watched_);
  for (int64_t off = 0; off < n; off += kChunk) {
    const int c = static_cast<int>(std::min(kChunk, n - off));
    check(MPI_Allreduce(MPI_IN_PLACE, data + off, c, type, mpi_op(op), comm_), "Allreduce");
  }
  if (op == ReduceOp::kAvg) scale(data, n, 1.0 / size_);
}

void MpiCommunicator::all_reduce(float* data, int64_t n, ReduceOp op) { all_reduce_impl(data, n, op, MPI_FLOAT); }
void MpiCommunicator::all_reduce(double* data, int64_t n, ReduceOp op) { all_reduce_impl(data, n, op, MPI_DOUBLE); }

std::unique_ptr<CommRequest> MpiCommunicator::all_reduce_async(float* data, int64_t n, ReduceOp op) {
  if (size_ == 1) return std::make_unique<DoneRequest>();
  std::vector<MPI_Request> reqs;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int c = static_cast<int>(std::min(kChunk, n - off));
    reqs.emplace_back();
    check(MPI_Iallreduce(MPI_IN_PLACE, data + off, c, MPI_FLOAT, mpi_op(op), comm_, &reqs.back()), "Iallreduce");
  }
  std::function<void()> after;
  if (op == ReduceOp::kAvg) after = [data, n, s = size_] { scale(data, n, 1.0 / s); };
  return std::make_unique<MpiRequest>(std::move(reqs), name_, std::move(after));
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) {
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (n > kChunk) throw std::runtime_error("reduce-scatter block above 2^30 elements");
  InFlight guard("reduce-scatter", name_, watched_);
  check(MPI_Reduce_scatter_block(send, recv, static_cast<int>(n), MPI_FLOAT, mpi_op(op), comm_), "Reduce_scatter_block");
  if (op == ReduceOp::kAvg) scale(recv, n, 1.0 / size_);
}

void MpiCommunicator::all_gather(const float* send, float* recv, int64_t n) { all_gather_async(send, recv, n)->wait(); }

std::unique_ptr<CommRequest> MpiCommunicator::all_gather_async(const float* send, float* recv, int64_t n) {
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * sizeof(float));
    return std::make_unique<DoneRequest>();
  }
  if (n > kChunk) throw std::runtime_error("all-gather block above 2^30 elements");
  std::vector<MPI_Request> reqs(1);
  // In place when send is this rank's block of recv.
  const void* src = send == recv + static_cast<int64_t>(rank_) * n ? MPI_IN_PLACE : send;
  check(MPI_Iallgather(src, static_cast<int>(n), MPI_FLOAT, recv, static_cast<int>(n), MPI_FLOAT, comm_, &reqs[0]), "Iallgather");
  return std::make_unique<MpiRequest>(std::move(reqs), name_, nullptr);
}

void MpiCommunicator::all_to_all(const float* send, float* recv, int64_t n) {
  if (n > kChunk) throw std::runtime_error("all-to-all block above 2^30 elements");
  InFlight guard("all-to-all", name_, watched_);
  check(MPI_Alltoall(send, static_cast<int>(n), MPI_FLOAT, recv, static_cast<int>(n), MPI_FLOAT, comm_), "Alltoall");
}

namespace {
std::vector<int> int_counts(const std::vector<int64_t>& counts, std::vector<int>* displs) {
  std::vector<int> c;
  int64_t off = 0;
  for (auto n : counts) {
    if (n > kChunk || off > INT_MAX) throw std::runtime_error("bucket above 2^30 elements: lower --ddp-bucket-size");
    c.push_back(static_cast<int>(n));
    if (displs) displs->push_back(static_cast<int>(off));
    off += n;
  }
  return c;
}
}  // namespace

std::unique_ptr<CommRequest> MpiCommunicator::reduce_scatter_v_async(const float* full, float* mine,
                                                                     const std::vector<int64_t>& counts, ReduceOp op) {
  const int64_t n = counts.at(static_cast<size_t>(rank_));
  if (size_ == 1) {
    if (full != mine) std::memmove(mine, full, static_cast<size_t>(n) * sizeof(float));
    return std::make_unique<DoneRequest>();
  }
  auto c = std::make_shared<std::vector<int>>(int_counts(counts, nullptr));
  std::vector<MPI_Request> reqs(1);
  check(MPI_Ireduce_scatter(full, mine, c->data(), MPI_FLOAT, mpi_op(op), comm_, &reqs[0]), "Ireduce_scatter");
  std::function<void()> after = [c] {};  // keeps the counts alive until completion
  if (op == ReduceOp::kAvg) after = [c, mine, n, s = size_] { scale(mine, n, 1.0 / s); };
  return std::make_unique<MpiRequest>(std::move(reqs), name_, std::move(after));
}

std::unique_ptr<CommRequest> MpiCommunicator::all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) {
  if (size_ == 1) {
    if (full != mine) std::memmove(full, mine, static_cast<size_t>(counts.at(0)) * sizeof(float));
    return std::make_unique<DoneRequest>();
  }
  auto d = std::make_shared<std::vector<int>>();
  auto c = std::make_shared<std::vector<int>>(int_counts(counts, d.get()));
  std::vector<MPI_Request> reqs(1);
  const void* src = mine == full + (*d)[static_cast<size_t>(rank_)] ? MPI_IN_PLACE : mine;
  check(MPI_Iallgatherv(src, (*c)[static_cast<size_t>(rank_)], MPI_FLOAT, full, c->data(), d->data(), MPI_FLOAT, comm_, &reqs[0]),
        "Iallgatherv");
  return std::make_unique<MpiRequest>(std::move(reqs), name_, [c, d] {});
}

void MpiCommunicator::send(const float* data, int64_t n, int peer) {
  InFlight guard("send", name_, watched_);
  for (int64_t off = 0; off < n; off += kChunk) {
    check(MPI_Send(data + off, static_cast<int>(std::min(kChunk, n - off)), MPI_FLOAT, peer, 0, comm_), "Send");
  }
}

void MpiCommunicator::recv(float* data, int64_t n, int peer) {
  InFlight guard("recv", name_, watched_);
  for (int64_t off = 0; off < n; off += kChunk) {
    check(MPI_Recv(data + off, static_cast<int>(std::min(kChunk, n - off)), MPI_FLOAT, peer, 0, comm_, MPI_STATUS_IGNORE), "Recv");
  }
}

void MpiCommunicator::all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                   const std::vector<int64_t>& recv_counts) {
  if (send_counts.size() != static_cast<size_t>(size_) || recv_counts.size() != static_cast<size_t>(size_)) {
    throw std::logic_error("all_to_all_v: one count per rank expected");
  }
  auto ints = [&](const std::vector<int64_t>& v) {
    std::vector<int> out;
    for (int64_t x : v) {
      if (x < 0 || x > INT_MAX) throw std::runtime_error("all-to-all of " + std::to_string(x) + " elements to one rank: MPI counts stop at 2^31 - 1");
      out.push_back(static_cast<int>(x));
    }
    return out;
  };
  const std::vector<int64_t> so = count_offsets(send_counts), ro = count_offsets(recv_counts);
  const std::vector<int> sc = ints(send_counts), rc = ints(recv_counts);
  const std::vector<int> sd = ints({so.begin(), so.end() - 1}), rd = ints({ro.begin(), ro.end() - 1});
  InFlight guard("all-to-all", name_, watched_);
  check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm_), "Alltoallv");
}

std::unique_ptr<CommRequest> MpiCommunicator::send_recv_batch_async(const std::vector<P2POp>& ops) {
  // Tag 1 keeps the batches apart from send() / recv(); MPI matches messages of one (peer, tag) in order, so
  // the chunks of a transfer, and the transfers, meet in posting order.
  constexpr int kBatchTag = 1;
  std::vector<MPI_Request> reqs;
  for (const P2POp& op : ops) {
    if (op.peer < 0 || op.peer >= size_) throw std::logic_error("send_recv_batch: peer " + std::to_string(op.peer) + " is not in the " + name_ + " group");
    for (int64_t off = 0; off < op.n || (op.n == 0 && off == 0); off += kChunk) {
      const int c = static_cast<int>(std::min(kChunk, op.n - off));
      reqs.emplace_back();
      if (op.kind == P2POp::Kind::kSend) check(MPI_Isend(op.data + off, c, MPI_FLOAT, op.peer, kBatchTag, comm_, &reqs.back()), "Isend");
      else check(MPI_Irecv(op.data + off, c, MPI_FLOAT, op.peer, kBatchTag, comm_, &reqs.back()), "Irecv");
      if (op.n == 0) break;
    }
  }
  return std::make_unique<MpiRequest>(std::move(reqs), name_, nullptr);
}

void MpiCommunicator::broadcast(void* data, int64_t bytes, int root) {
  if (size_ == 1) return;
  InFlight guard("broadcast", name_, watched_);
  char* p = static_cast<char*>(data);
  for (int64_t off = 0; off < bytes; off += kChunk) {
    check(MPI_Bcast(p + off, static_cast<int>(std::min(kChunk, bytes - off)), MPI_BYTE, root, comm_), "Bcast");
  }
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  InFlight guard("barrier", name_, watched_);
  check(MPI_Barrier(comm_), "Barrier");
}

std::vector<std::string> MpiCommunicator::all_gather_strings(const std::string& mine) {
  InFlight guard("all-gather", name_, watched_);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_), "Allgather");
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += lens[static_cast<size_t>(r)];
  }
  std::string all(static_cast<size_t>(total), '\0');
  check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, all.data(), lens.data(), displs.data(), MPI_BYTE, comm_), "Allgatherv");
  std::vector<std::string> out;
  for (int r = 0; r < size_; ++r) out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]), static_cast<size_t>(lens[static_cast<size_t>(r)])));
  return out;
}

std::shared_ptr<Communicator> MpiCommunicator::sub_group(int color, int key, const std::string& name) {
  MPI_Comm c;
  check(MPI_Comm_split(comm_, color, key, &c), "Comm_split");
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return std::make_shared<MpiCommunicator>(c, name, watched_);
}

void mpi_initialize(int* argc, char*** argv) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  g_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  g_world_rank = rank;
}

bool mpi_thread_multiple() { return g_thread_multiple; }

bool mpi_active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void mpi_finalize() {
  if (!mpi_active()) return;
  stop_liveness_responder();
  MPI_Finalize();
}

void mpi_abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

ProcessGroups make_mpi_process_groups(const RankLayout& layout, int64_t r) {
  auto world = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, "world");
  MPI_Comm dup;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "Comm_dup");
  auto checkpoint = std::make_shared<MpiCommunicator>(dup, "checkpoint", false);
  ProcessGroups g = split_layout_groups(layout, r, [](int color, int key, const std::string& name) -> std::shared_ptr<Communicator> {
    MPI_Comm c;
    check(MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &c), "Comm_split");
    if (c == MPI_COMM_NULL) return nullptr;
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    return std::make_shared<MpiCommunicator>(c, name);
  });
  g.world = world;
  g.checkpoint = checkpoint;
  return g;
}

void start_collective_watchdog(int64_t timeout_seconds, int64_t world_rank) {
  g_world_rank = world_rank;
  // What this rank answers when another rank's collective times out and asks (comm/mpi_liveness.h).
  start_liveness_responder([] {
    const int64_t since = g_since_ns.load();
    if (since == 0) return std::string("is running (not in a collective)");
    std::string group;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      group = g_group_name;
    }
    char buf[160];
    std::snprintf(buf, sizeof(buf), "has waited %.1f s in %s on the %s group", static_cast<double>(now_ns() - since) / 1e9, g_op.load(), group.c_str());
    return std::string(buf);
  });
  std::thread([timeout_seconds] {
    const int64_t limit = timeout_seconds * 1000000000LL;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const int64_t since = g_since_ns.load();
      if (since != 0 && now_ns() - since > limit) {
        std::string group;
        {
          std::lock_guard<std::mutex> lock(g_mu);
          group = g_group_name;
        }
        // The other ranks, asked point to point: the one that stopped does not answer.
        std::string who = ask_other_ranks(3.0);
        if (who.empty()) who = "another rank has probably failed (see its message above)";
        std::fprintf(stderr,
                     "megatrain: error: rank %lld waited more than %lld s in %s on the %s group: %s; aborting the job "
                     "(--distributed-timeout-seconds)\n",
                     static_cast<long long>(g_world_rank.load()), static_cast<long long>(timeout_seconds), g_op.load(), group.c_str(),
                     who.c_str());
        mpi_abort_job(3);
      }
    }
  }).detach();
}

}  // namespace mt
