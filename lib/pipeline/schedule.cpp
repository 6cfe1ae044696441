// schedule.cpp: the no-pipelining schedule, the schedule checks and the executor.
#include "pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
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
  std::map<int64_t, size_t> last_of_chunk;
  size_t last = schedule.size();
  for (size_t i = 0; i < schedule.size(); ++i) {
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
      case ActionKind::kBackwardWeight: stage.backward_weights(a.microbatch, a.chunk); break;
      case ActionKind::kSendForward: stage.send_forward(a.microbatch, a.chunk); break;
      case ActionKind::kRecvForward: stage.recv_forward(a.microbatch, a.chunk); break;
      case ActionKind::kSendBackward: stage.send_backward(a.microbatch, a.chunk); break;
      case ActionKind::kRecvBackward: stage.recv_backward(a.microbatch, a.chunk); break;
    }
  }
}

}  // namespace mt
