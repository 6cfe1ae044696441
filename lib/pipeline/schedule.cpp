// schedule.cpp: the no-pipelining schedule, the schedule checks and the executor.
#include "pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "pipeline/stage.h"

namespace mt {

std::string action_name(const ScheduleAction& a) {
  static const char* names[] = {"F", "B", "Bi", "W", "SF", "RF", "SB", "RB"};
  std::string s(names[static_cast<int>(a.kind)]);
  s.append(std::to_string(a.microbatch));
  if (a.chunk > 0) s.append(".").append(std::to_string(a.chunk));
  return s;
}

Schedule no_pipelining_schedule(int64_t num_microbatches, bool split_weights) {
  Schedule s;
  for (int64_t m = 0; m < num_microbatches; ++m) {
    s.push_back({ActionKind::kForward, m, 0});
    if (split_weights) {
      s.push_back({ActionKind::kBackwardInput, m, 0});
      s.push_back({ActionKind::kBackwardWeight, m, 0});
    } else {
      s.push_back({ActionKind::kBackward, m, 0});
    }
  }
  return s;
}

Schedule one_f_one_b_schedule(int64_t rank, int64_t stages, int64_t num_microbatches, bool split_weights) {
  if (stages < 1 || rank < 0 || rank >= stages) throw std::logic_error("one_f_one_b_schedule: stage out of range");
  const bool first = rank == 0, last = rank == stages - 1;
  const int64_t M = num_microbatches, warmup = std::min(stages - rank - 1, M), steady = M - warmup;
  Schedule s;
  auto put = [&](ActionKind k, int64_t m) { s.push_back({k, m, 0}); };
  auto recv_forward = [&](int64_t m) {
    if (!first) put(ActionKind::kRecvForward, m);
  };
  auto send_forward = [&](int64_t m) {
    if (!last) put(ActionKind::kSendForward, m);
  };
  auto recv_backward = [&](int64_t m) {
    if (!last) put(ActionKind::kRecvBackward, m);
  };
  auto send_backward = [&](int64_t m) {
    if (!first) put(ActionKind::kSendBackward, m);
  };
  auto backward = [&](int64_t m) {
    if (split_weights) {
      put(ActionKind::kBackwardInput, m);
      put(ActionKind::kBackwardWeight, m);
    } else {
      put(ActionKind::kBackward, m);
    }
  };
  for (int64_t i = 0; i < warmup; ++i) {
    recv_forward(i);
    put(ActionKind::kForward, i);
    send_forward(i);
  }
  if (steady > 0) recv_forward(warmup);
  for (int64_t i = 0; i < steady; ++i) {
    put(ActionKind::kForward, warmup + i);
    send_forward(warmup + i);  // with the next receive: Megatron's send_forward_recv_backward
    recv_backward(i);
    backward(i);
    send_backward(i);
    if (i + 1 < steady) recv_forward(warmup + i + 1);  // send_backward_recv_forward
  }
  for (int64_t i = 0; i < warmup; ++i) {
    recv_backward(steady + i);
    backward(steady + i);
    send_backward(steady + i);
  }
  return s;
}

Schedule forward_only_schedule(int64_t rank, int64_t stages, int64_t num_microbatches) {
  Schedule s;
  for (int64_t m = 0; m < num_microbatches; ++m) {
    if (rank > 0) s.push_back({ActionKind::kRecvForward, m, 0});
    s.push_back({ActionKind::kForward, m, 0});
    if (rank + 1 < stages) s.push_back({ActionKind::kSendForward, m, 0});
  }
  return s;
}

namespace {

bool is_transfer(ActionKind k) {
  return k == ActionKind::kSendForward || k == ActionKind::kRecvForward || k == ActionKind::kSendBackward || k == ActionKind::kRecvBackward;
}

}  // namespace

std::string check_pipeline(const std::vector<Schedule>& schedules) {
  const auto P = static_cast<int64_t>(schedules.size());
  // Each transfer is one message: (forward or backward direction, sender, sequence number on that link);
  // a send and a receive meet when they name the same message. The message carries the microbatch.
  struct Op {
    bool send;
    int64_t peer;
    std::tuple<int, int64_t, int64_t> msg;
    int64_t microbatch;
  };
  std::vector<std::vector<std::vector<Op>>> runs(static_cast<size_t>(P));  // per stage, its runs of transfers
  std::vector<std::vector<int64_t>> step_run(static_cast<size_t>(P));      // per action: its run, or -1
  for (int64_t r = 0; r < P; ++r) {
    std::map<std::pair<int, int64_t>, int64_t> sent, got;  // (direction, link's sender) -> count
    const Schedule& s = schedules[static_cast<size_t>(r)];
    for (size_t i = 0; i < s.size(); ++i) {
      const ScheduleAction& a = s[i];
      if (!is_transfer(a.kind)) {
        step_run[static_cast<size_t>(r)].push_back(-1);
        continue;
      }
      if (i == 0 || !is_transfer(s[i - 1].kind)) runs[static_cast<size_t>(r)].emplace_back();
      step_run[static_cast<size_t>(r)].push_back(static_cast<int64_t>(runs[static_cast<size_t>(r)].size()) - 1);
      const bool fwd = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward;
      const bool send = a.kind == ActionKind::kSendForward || a.kind == ActionKind::kSendBackward;
      const int64_t peer = fwd == send ? r + 1 : r - 1;
      if (peer < 0 || peer >= P) return "stage " + std::to_string(r) + ": " + action_name(a) + " has no neighbour there";
      const int64_t sender = send ? r : peer;
      int64_t& n = (send ? sent : got)[{fwd ? 0 : 1, sender}];
      runs[static_cast<size_t>(r)].back().push_back({send, peer, {fwd ? 0 : 1, sender, n++}, a.microbatch});
    }
  }
  // Run every stage as far as it goes: compute actions at once, a run of transfers when each of its
  // messages' partners is posted (in the partner's current run).
  std::vector<size_t> pc(static_cast<size_t>(P), 0);
  auto current_run = [&](int64_t r) -> int64_t {
    const size_t i = pc[static_cast<size_t>(r)];
    return i < schedules[static_cast<size_t>(r)].size() ? step_run[static_cast<size_t>(r)][i] : -1;
  };
  // A message meets once both its send and its receive are posted (each in its stage's current run); a run
  // completes when all its messages have met.
  std::set<std::tuple<int, int64_t, int64_t>> met;
  for (bool moved = true; moved;) {
    moved = false;
    for (int64_t r = 0; r < P; ++r) {
      const auto ru = static_cast<size_t>(r);
      while (pc[ru] < schedules[ru].size() && step_run[ru][pc[ru]] < 0) {
        ++pc[ru];
        moved = true;
      }
    }
    for (int64_t r = 0; r < P; ++r) {
      const int64_t run = current_run(r);
      if (run < 0) continue;
      for (const Op& op : runs[static_cast<size_t>(r)][static_cast<size_t>(run)]) {
        const int64_t prun = current_run(op.peer);
        if (prun < 0 || met.count(op.msg)) continue;
        for (const Op& other : runs[static_cast<size_t>(op.peer)][static_cast<size_t>(prun)]) {
          if (other.send == op.send || other.msg != op.msg) continue;
          if (other.microbatch != op.microbatch) {
            return "stage " + std::to_string(r) + " and stage " + std::to_string(op.peer) + " exchange microbatch " + std::to_string(op.microbatch) +
                   " against " + std::to_string(other.microbatch);
          }
          met.insert(op.msg);
        }
      }
    }
    for (int64_t r = 0; r < P; ++r) {
      const int64_t run = current_run(r);
      if (run < 0) continue;
      bool done = true;
      for (const Op& op : runs[static_cast<size_t>(r)][static_cast<size_t>(run)]) done = done && met.count(op.msg) > 0;
      if (!done) continue;
      const auto ru = static_cast<size_t>(r);
      while (pc[ru] < schedules[ru].size() && step_run[ru][pc[ru]] == run) ++pc[ru];
      moved = true;
    }
  }
  for (int64_t r = 0; r < P; ++r) {
    const auto ru = static_cast<size_t>(r);
    if (pc[ru] < schedules[ru].size()) {
      return "stage " + std::to_string(r) + " waits forever at " + action_name(schedules[ru][pc[ru]]) + " (action " + std::to_string(pc[ru]) + ")";
    }
  }
  return {};
}

std::string check_schedule(const Schedule& schedule, int64_t num_microbatches, int64_t num_chunks) {
  // Per (microbatch, chunk): 0 nothing yet, 1 forwarded, 2 input gradients done (W due), 3 done.
  std::map<std::pair<int64_t, int64_t>, int> state;
  for (const ScheduleAction& a : schedule) {
    if (a.microbatch < 0 || a.microbatch >= num_microbatches || a.chunk < 0 || a.chunk >= num_chunks) {
      return action_name(a) + " is outside the iteration's microbatches or chunks";
    }
    int& st = state[{a.microbatch, a.chunk}];
    switch (a.kind) {
      case ActionKind::kForward:
        if (st != 0) return action_name(a) + ": a second forward";
        st = 1;
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (st != 1) return action_name(a) + ": a backward " + (st == 0 ? "before its forward" : "run twice");
        st = a.kind == ActionKind::kBackward ? 3 : 2;
        break;
      case ActionKind::kBackwardWeight:
        if (st != 2) return action_name(a) + ": weight gradients without their input-gradient half before them";
        st = 3;
        break;
      default:
        break;  // transfers: matched across ranks by the pipeline schedules' own checks
    }
  }
  for (int64_t m = 0; m < num_microbatches; ++m) {
    for (int64_t c = 0; c < num_chunks; ++c) {
      const auto it = state.find({m, c});
      if (it == state.end() || it->second != 3) {
        return "microbatch " + std::to_string(m) + " of chunk " + std::to_string(c) + " does not finish its forward and backward";
      }
    }
  }
  return {};
}

int64_t peak_in_flight(const Schedule& schedule) {
  std::set<std::pair<int64_t, int64_t>> open;
  int64_t peak = 0;
  for (const ScheduleAction& a : schedule) {
    if (a.kind == ActionKind::kForward) open.insert({a.microbatch, a.chunk});
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) open.erase({a.microbatch, a.chunk});
    peak = std::max<int64_t>(peak, static_cast<int64_t>(open.size()));
  }
  return peak;
}

void run_schedule(const Schedule& schedule, PipelineStage& stage, const std::function<void()>& before_last_backward) {
  auto is_backward = [](const ScheduleAction& a) { return a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput; };
  std::map<int64_t, size_t> last_of_chunk, last_w_of_chunk;
  size_t last = schedule.size();
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (schedule[i].kind == ActionKind::kBackwardWeight) last_w_of_chunk[schedule[i].chunk] = i;
    if (!is_backward(schedule[i])) continue;
    last_of_chunk[schedule[i].chunk] = i;
    last = i;
  }
  for (size_t i = 0; i < schedule.size(); ++i) {
    const ScheduleAction& a = schedule[i];
    switch (a.kind) {
      case ActionKind::kForward: stage.forward(a.microbatch, a.chunk); break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (i == last && before_last_backward) before_last_backward();
        stage.backward(a.microbatch, a.chunk, last_of_chunk[a.chunk] == i, a.kind == ActionKind::kBackward);
        break;
      case ActionKind::kBackwardWeight: stage.backward_weights(a.microbatch, a.chunk, last_w_of_chunk[a.chunk] == i); break;
      default: {  // a run of consecutive transfers goes out as one batch
        std::vector<ScheduleAction> run;
        while (i < schedule.size() && is_transfer(schedule[i].kind)) run.push_back(schedule[i++]);
        --i;
        stage.exchange(run);
      }
    }
  }
}

}  // namespace mt
