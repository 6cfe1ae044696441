// schedule.cpp: the schedules (no pipelining, 1F1B, ZB-H1, interleaved 1F1B, forwards only), their checks and
// the executor.
#include "pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "pipeline/stage.h"

namespace mt {

namespace {

bool is_transfer(ActionKind k) {
  return k == ActionKind::kSendForward || k == ActionKind::kRecvForward || k == ActionKind::kSendBackward || k == ActionKind::kRecvBackward;
}

// The virtual stage of chunk c on rank r (Megatron's order: every rank's chunk 0, then every rank's chunk 1, ...).
int64_t virtual_stage(int64_t rank, int64_t stages, int64_t chunk) { return chunk * stages + rank; }

// The compute actions of one rank (forwards, backwards, weight-gradient passes) with the boundary transfers
// put where each is due: a forward's input received just before it and its output sent just after it, a
// backward's output gradient received just before it and its input gradient sent just after it (none at
// the ends of the pipeline). Consecutive transfers form one batch in the executor, so each send goes out
// with the next receive (Megatron's send_forward_recv_backward and send_backward_recv_forward). A weight-
// gradient pass that a batch follows moves behind it: it needs nothing from the neighbours, so it runs
// while the batch is in flight.
Schedule with_transfers(const Schedule& compute, int64_t rank, int64_t stages, int64_t chunks) {
  const int64_t last_vs = stages * chunks - 1;
  Schedule s;
  for (const ScheduleAction& a : compute) {
    const int64_t vs = virtual_stage(rank, stages, a.chunk);
    switch (a.kind) {
      case ActionKind::kForward:
        if (vs > 0) s.push_back({ActionKind::kRecvForward, a.microbatch, a.chunk});
        s.push_back(a);
        if (vs < last_vs) s.push_back({ActionKind::kSendForward, a.microbatch, a.chunk});
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (vs < last_vs) s.push_back({ActionKind::kRecvBackward, a.microbatch, a.chunk});
        s.push_back(a);
        if (vs > 0) s.push_back({ActionKind::kSendBackward, a.microbatch, a.chunk});
        break;
      default: s.push_back(a);
    }
  }
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].kind != ActionKind::kBackwardWeight) continue;
    size_t k = i, j;
    while (k < s.size() && s[k].kind == ActionKind::kBackwardWeight) ++k;  // a run of weight-gradient passes
    for (j = k; j < s.size() && is_transfer(s[j].kind); ++j) {
    }
    const auto at = [&](size_t n) { return s.begin() + static_cast<std::ptrdiff_t>(n); };
    std::rotate(at(i), at(k), at(j));  // ... then the batch that followed them, then them
    i = j - 1;
  }
  return s;
}

void check_stage(int64_t rank, int64_t stages, const char* what) {
  if (stages < 1 || rank < 0 || rank >= stages) throw std::logic_error(std::string(what) + ": stage out of range");
}

}  // namespace

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
  check_stage(rank, stages, "one_f_one_b_schedule");
  // Megatron's warm-up of w forwards, then one forward and one backward, then the warm-up's backwards: at
  // step x the forward of microbatch x and the backward of microbatch x - w.
  const int64_t M = num_microbatches, w = std::min(stages - rank - 1, M);
  Schedule compute;
  for (int64_t x = 0; x < M + w; ++x) {
    if (x < M) compute.push_back({ActionKind::kForward, x, 0});
    if (x < w) continue;
    if (split_weights) {
      compute.push_back({ActionKind::kBackwardInput, x - w, 0});
      compute.push_back({ActionKind::kBackwardWeight, x - w, 0});
    } else {
      compute.push_back({ActionKind::kBackward, x - w, 0});
    }
  }
  return with_transfers(compute, rank, stages, 1);
}

Schedule zero_bubble_h1_schedule(int64_t rank, int64_t stages, int64_t num_microbatches) {
  check_stage(rank, stages, "zero_bubble_h1_schedule");
  // Qi et al.'s ZB-H1: at step x the forward of microbatch x, the input-gradient half B of microbatch
  // x - (stages - 1 - rank) (1F1B's backward) and the weight-gradient half W of microbatch x - (stages - 1).
  // B alone is on the critical path between the stages, so gradients reach the earlier stages sooner, and
  // each stage's deferred W passes fill the cool-down bubble; no stage holds more than `stages`
  // microbatches (the first stage's 1F1B peak).
  const int64_t M = num_microbatches, b_lag = stages - 1 - rank, w_lag = stages - 1;
  Schedule compute;
  for (int64_t x = 0; x < M + w_lag; ++x) {
    if (x < M) compute.push_back({ActionKind::kForward, x, 0});
    if (x >= b_lag && x - b_lag < M) compute.push_back({ActionKind::kBackwardInput, x - b_lag, 0});
    if (x >= w_lag) compute.push_back({ActionKind::kBackwardWeight, x - w_lag, 0});
  }
  return with_transfers(compute, rank, stages, 1);
}

namespace {

// Megatron's interleaved order (get_schedule_table): groups of `group` microbatches (the last group takes the rest) pass
// through the chunks in turn, so the k-th forward of a rank runs the table's k-th (microbatch, chunk), and its k-th
// backward the same microbatch through chunk chunks - 1 - chunk. group = stages: Megatron's default, depth-first.
class InterleavedTable {
 public:
  InterleavedTable(int64_t microbatches, int64_t chunks, int64_t group) : chunks_(chunks) {
    for (int64_t first = 0; first < microbatches; first += group) {
      const int64_t end = first + group >= microbatches ? microbatches : first + group;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t m = first; m < end; ++m) entries_.push_back({m, c});
      }
    }
  }
  // The chunk of the k-th forward (backward); k outside [0, total) wraps as Megatron's Python index does.
  int64_t chunk(int64_t k, bool forward) const {
    const auto total = static_cast<int64_t>(entries_.size());
    const int64_t c = entries_[static_cast<size_t>(((k % total) + total) % total)].second;
    return forward ? c : chunks_ - 1 - c;
  }
  ScheduleAction action(int64_t k, bool forward) const {
    return {forward ? ActionKind::kForward : ActionKind::kBackward, entries_[static_cast<size_t>(k)].first, chunk(k, forward)};
  }

 private:
  int64_t chunks_;
  std::vector<std::pair<int64_t, int64_t>> entries_;  // (microbatch, chunk) in the forwards' order
};

// Megatron's rules for the group (forward_backward_pipelining_with_interleaving): between the stages and the
// microbatches, and a last group of none or at least `stages` (else the pipeline waits on itself).
void check_group(int64_t stages, int64_t microbatches, int64_t group, const char* what) {
  if (group < stages || group > microbatches) {
    throw std::logic_error(std::string(what) + ": the microbatches per virtual-stage group (" + std::to_string(group) + ") must range in [PP = " +
                           std::to_string(stages) + ", microbatches = " + std::to_string(microbatches) + "]");
  }
  const int64_t last = microbatches % group;
  if (last > 0 && last < stages) {
    throw std::logic_error(std::string(what) + ": the microbatches (" + std::to_string(microbatches) + ") leave a last group of " + std::to_string(last) +
                           ", fewer than the pipeline size (" + std::to_string(stages) + ")");
  }
}

// Megatron's forward_backward_pipelining_with_interleaving, or with forward_only its evaluation (every step a warm-up
// forward, with the same transfers).
Schedule interleaved(int64_t rank, int64_t stages, int64_t chunks, int64_t num_microbatches, int64_t group, bool forward_only) {
  if (group == 0) group = stages;
  check_group(stages, num_microbatches, group, forward_only ? "forward_only_schedule" : "interleaved_schedule");
  const InterleavedTable table(num_microbatches, chunks, group);
  const int64_t P = stages, V = chunks, total = num_microbatches * V;
  const bool first_rank = rank == 0, last_rank = rank == P - 1;
  // Megatron's warm-up: (chunks - 1) x group forwards on every rank, two more per stage before the last.
  int64_t warmup = forward_only ? total : (P - rank - 1) * 2 + (V - 1) * group;
  const bool all_warmup = warmup >= total;
  if (all_warmup) warmup = total;
  const int64_t remaining = total - warmup;
  Schedule s;
  // Megatron's transfers: one batch after each step, carrying this step's sends and the receives of what the
  // next steps need; a chunk's received tensors queue in order, so the n-th receive of chunk c is its
  // microbatch n.
  std::vector<int64_t> forward_in(static_cast<size_t>(V), 0), backward_in(static_cast<size_t>(V), 0);
  auto recv_forward = [&](int64_t chunk) { s.push_back({ActionKind::kRecvForward, forward_in[static_cast<size_t>(chunk)]++, chunk}); };
  auto recv_backward = [&](int64_t chunk) { s.push_back({ActionKind::kRecvBackward, backward_in[static_cast<size_t>(chunk)]++, chunk}); };
  auto forward = [&](int64_t k) {
    const ScheduleAction a = table.action(k, true);
    s.push_back(a);
    if (!(last_rank && a.chunk == V - 1)) s.push_back({ActionKind::kSendForward, a.microbatch, a.chunk});
  };
  auto backward = [&](int64_t k) -> ScheduleAction {
    const ScheduleAction a = table.action(k, false);
    s.push_back(a);
    return a;
  };
  auto send_backward = [&](const ScheduleAction& b) {
    if (!(first_rank && b.chunk == 0)) s.push_back({ActionKind::kSendBackward, b.microbatch, b.chunk});
  };
  // Megatron's recv_tensor_from_previous_stage: whether the transfers after a rank's k-th forward (backward) receive for
  // a later one, and into which chunk. The leading rank of the direction (the first for forwards, the last for
  // backwards) is ahead of the other end by stages - 1 steps: it receives what that end sent stages - 1 steps before,
  // the next chunk's input, unless that was the end's last chunk (nothing crosses back); the others receive the next step's.
  auto next_receive = [&](int64_t k, bool forward_direction) -> std::pair<bool, int64_t> {
    const bool leading = forward_direction ? first_rank : last_rank;
    if (!leading) return {true, table.chunk(k + 1, forward_direction)};
    if (k < P - 1) return {false, 0};
    const int64_t c = table.chunk(k - (P - 1), forward_direction);
    if (c == (forward_direction ? V - 1 : 0)) return {false, 0};
    return {true, forward_direction ? c + 1 : c - 1};
  };
  if (!first_rank) recv_forward(0);
  for (int64_t k = 0; k < warmup; ++k) {
    forward(k);
    if (const auto [recv, chunk] = next_receive(k, true); recv && k != total - 1) recv_forward(chunk);
    if (k == warmup - 1 && !all_warmup && !last_rank) recv_backward(V - 1);
  }
  for (int64_t k = 0; k < remaining; ++k) {
    const int64_t fk = k + warmup;
    forward(fk);
    // The forward's send went in with forward(); the backward's joins the same batch.
    const size_t sends_at = s.size();
    send_backward(backward(k));
    // Megatron's steady state runs the forward and the backward, then one batch: move the forward's send
    // (if any) behind the backward so that the four transfers are consecutive.
    if (s[sends_at - 1].kind == ActionKind::kSendForward) {
      const auto at = [&](size_t n) { return s.begin() + static_cast<std::ptrdiff_t>(n); };
      std::rotate(at(sends_at - 1), at(sends_at), at(sends_at + 1));
    }
    auto [recv_prev, next_forward_chunk] = next_receive(fk, true);
    const auto [recv_next, next_backward_chunk] = next_receive(k, false);
    if (k == remaining - 1) recv_prev = false;  // (the cool-down's backwards need no more forwards' inputs)
    if (recv_prev) recv_forward(next_forward_chunk);
    if (recv_next) recv_backward(next_backward_chunk);
  }
  if (forward_only) return s;
  if (all_warmup && !last_rank) recv_backward(V - 1);
  for (int64_t k = remaining; k < total; ++k) {
    send_backward(backward(k));
    if (const auto [recv, chunk] = next_receive(k, false); recv && k != total - 1) recv_backward(chunk);
  }
  return s;
}

}  // namespace

Schedule interleaved_schedule(int64_t rank, int64_t stages, int64_t chunks, int64_t num_microbatches, int64_t group) {
  check_stage(rank, stages, "interleaved_schedule");
  if (chunks < 1) throw std::logic_error("interleaved_schedule: chunks must be >= 1");
  if (chunks == 1) return one_f_one_b_schedule(rank, stages, num_microbatches);
  return interleaved(rank, stages, chunks, num_microbatches, group, false);
}

Schedule forward_only_schedule(int64_t rank, int64_t stages, int64_t num_microbatches, int64_t chunks, int64_t group) {
  check_stage(rank, stages, "forward_only_schedule");
  Schedule compute;
  if (chunks == 1) {
    for (int64_t m = 0; m < num_microbatches; ++m) compute.push_back({ActionKind::kForward, m, 0});
  } else {
    return interleaved(rank, stages, chunks, num_microbatches, group, true);
  }
  return with_transfers(compute, rank, stages, chunks);
}

PipelineTiming simulate_pipeline(const std::vector<Schedule>& schedules, int64_t chunks, const ActionCost& cost) {
  PipelineTiming out;
  auto fail = [&](std::string why) {
    out.error = std::move(why);
    return out;
  };
  const auto P = static_cast<int64_t>(schedules.size());
  const int64_t last_vs = P * chunks - 1;
  // Each transfer is one message on the link from its sender to its receiver, the link's n-th: the
  // communicators match a pair's messages in the order posted, whatever they carry, so a send and a receive
  // meet when they are the same link's n-th, and must then agree on the direction, the microbatch and the
  // virtual stages at both ends.
  struct Op {
    bool send;
    int64_t peer;
    std::tuple<int64_t, int64_t, int64_t> msg;  // (sender, receiver, n)
    int direction;                               // 0 forward, 1 backward
    int64_t microbatch, sender_vs;
  };
  std::vector<std::vector<std::vector<Op>>> runs(static_cast<size_t>(P));  // per stage, its runs of transfers
  std::vector<std::vector<int64_t>> step_run(static_cast<size_t>(P));      // per action: its run, or -1
  for (int64_t r = 0; r < P; ++r) {
    std::map<std::pair<int64_t, int64_t>, int64_t> count;  // (sender, receiver) -> messages posted here so far
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
      const int64_t vs = virtual_stage(r, P, a.chunk);
      const int64_t peer_vs = fwd == send ? vs + 1 : vs - 1;  // a forward goes to the next virtual stage
      if (a.chunk < 0 || a.chunk >= chunks || peer_vs < 0 || peer_vs > last_vs) {
        return fail("stage " + std::to_string(r) + ": " + action_name(a) + " has no neighbour there");
      }
      const int64_t peer = peer_vs % P;
      const int64_t sender = send ? r : peer, receiver = send ? peer : r;
      int64_t& n = count[{sender, receiver}];
      runs[static_cast<size_t>(r)].back().push_back({send, peer, {sender, receiver, n++}, fwd ? 0 : 1, a.microbatch, send ? vs : peer_vs});
    }
  }
  // Run every stage as far as it goes: compute actions at once, a run of transfers when each of its
  // messages' partners is posted (in the partner's current run). Each rank keeps a clock: a compute action
  // takes its cost, a run of transfers completes when the last of its partners was posted, and the
  // weight-gradient passes right after a run start when it was posted (the executor runs them while it is
  // in flight).
  std::vector<size_t> pc(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0.0), posted(static_cast<size_t>(P), -1.0), run_done(static_cast<size_t>(P), 0.0);
  auto current_run = [&](int64_t r) -> int64_t {
    const size_t i = pc[static_cast<size_t>(r)];
    return i < schedules[static_cast<size_t>(r)].size() ? step_run[static_cast<size_t>(r)][i] : -1;
  };
  // A message meets once both its send and its receive are posted (each in its stage's current run); a run
  // completes when all its messages have met.
  std::set<std::tuple<int64_t, int64_t, int64_t>> met;
  // Per rank, the (direction, microbatch, chunk) received so far: a forward or backward needs its input.
  std::vector<std::set<std::tuple<int, int64_t, int64_t>>> arrived(static_cast<size_t>(P));
  for (bool moved = true; moved;) {
    moved = false;
    for (int64_t r = 0; r < P; ++r) {
      const auto ru = static_cast<size_t>(r);
      while (pc[ru] < schedules[ru].size() && step_run[ru][pc[ru]] < 0) {
        const ScheduleAction& a = schedules[ru][pc[ru]];
        const int64_t vs = virtual_stage(r, P, a.chunk);
        const bool needs_input = a.kind == ActionKind::kForward ? vs > 0 : a.kind != ActionKind::kBackwardWeight && vs < last_vs;
        const int direction = a.kind == ActionKind::kForward ? 0 : 1;
        if (needs_input && !arrived[ru].count({direction, a.microbatch, a.chunk})) {
          return fail("stage " + std::to_string(r) + " runs " + action_name(a) + " before its " + (direction == 0 ? "activations" : "gradient") +
                      " arrive");
        }
        const double d = cost ? cost(r, a) : 1.0;
        clock[ru] += d;
        out.busy += d;
        ++pc[ru];
        moved = true;
      }
      if (pc[ru] < schedules[ru].size() && posted[ru] < 0) posted[ru] = clock[ru];  // at a run of transfers
    }
    for (int64_t r = 0; r < P; ++r) {
      const int64_t run = current_run(r);
      if (run < 0) continue;
      for (const Op& op : runs[static_cast<size_t>(r)][static_cast<size_t>(run)]) {
        const int64_t prun = current_run(op.peer);
        if (prun < 0 || met.count(op.msg)) continue;
        for (const Op& other : runs[static_cast<size_t>(op.peer)][static_cast<size_t>(prun)]) {
          if (other.send == op.send || other.msg != op.msg) continue;
          if (other.direction != op.direction || other.microbatch != op.microbatch || other.sender_vs != op.sender_vs) {
            // (reported below)
            auto what = [](const Op& o) {
              return std::string(o.direction == 0 ? "activations" : "gradients") + " of microbatch " + std::to_string(o.microbatch) +
                     " from virtual stage " + std::to_string(o.sender_vs);
            };
            return fail("stage " + std::to_string(r) + " and stage " + std::to_string(op.peer) + " exchange microbatch " +
                        std::to_string(op.microbatch) + " against " + std::to_string(other.microbatch) + ": " + what(op) + " meets " + what(other));
          }
          met.insert(op.msg);
          const double at = std::max(posted[static_cast<size_t>(r)], posted[static_cast<size_t>(op.peer)]);
          for (const int64_t side : {r, op.peer}) run_done[static_cast<size_t>(side)] = std::max(run_done[static_cast<size_t>(side)], at);
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
      for (; pc[ru] < schedules[ru].size() && step_run[ru][pc[ru]] == run; ++pc[ru]) {
        const ScheduleAction& a = schedules[ru][pc[ru]];
        if (a.kind == ActionKind::kRecvForward) arrived[ru].insert({0, a.microbatch, a.chunk});
        if (a.kind == ActionKind::kRecvBackward) arrived[ru].insert({1, a.microbatch, a.chunk});
      }
      double overlapped = posted[ru];
      for (; pc[ru] < schedules[ru].size() && schedules[ru][pc[ru]].kind == ActionKind::kBackwardWeight; ++pc[ru]) {
        const double d = cost ? cost(r, schedules[ru][pc[ru]]) : 1.0;
        overlapped += d;
        out.busy += d;
      }
      clock[ru] = std::max(overlapped, run_done[ru]);
      posted[ru] = -1.0;
      run_done[ru] = 0.0;
      moved = true;
    }
  }
  for (int64_t r = 0; r < P; ++r) {
    const auto ru = static_cast<size_t>(r);
    if (pc[ru] < schedules[ru].size()) {
      return fail("stage " + std::to_string(r) + " waits forever at " + action_name(schedules[ru][pc[ru]]) + " (action " + std::to_string(pc[ru]) + ")");
    }
    out.makespan = std::max(out.makespan, clock[ru]);
  }
  return out;
}

std::string check_pipeline(const std::vector<Schedule>& schedules, int64_t chunks) { return simulate_pipeline(schedules, chunks, {}).error; }

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
  for (size_t i = 0; i < schedule.size(); ++i) {
    if (schedule[i].kind == ActionKind::kBackwardWeight) last_w_of_chunk[schedule[i].chunk] = i;
    if (is_backward(schedule[i])) last_of_chunk[schedule[i].chunk] = i;
  }
  size_t arm_at = schedule.size();  // the first chunk's last backward: the first gradients final for the iteration
  for (const auto& [chunk, i] : last_of_chunk) arm_at = std::min(arm_at, i);
  bool exchanging = false;  // a batch of transfers posted and not yet complete
  auto complete = [&] {
    if (exchanging) stage.complete_exchange();
    exchanging = false;
  };
  for (size_t i = 0; i < schedule.size(); ++i) {
    const ScheduleAction& a = schedule[i];
    if (a.kind != ActionKind::kBackwardWeight) complete();  // weight gradients need nothing from the neighbours
    switch (a.kind) {
      case ActionKind::kForward: stage.forward(a.microbatch, a.chunk); break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        if (i == arm_at && before_last_backward) before_last_backward();
        stage.backward(a.microbatch, a.chunk, last_of_chunk[a.chunk] == i, a.kind == ActionKind::kBackward);
        break;
      case ActionKind::kBackwardWeight: stage.backward_weights(a.microbatch, a.chunk, last_w_of_chunk[a.chunk] == i); break;
      default: {  // a run of consecutive transfers goes out as one batch
        std::vector<ScheduleAction> run;
        while (i < schedule.size() && is_transfer(schedule[i].kind)) run.push_back(schedule[i++]);
        --i;
        stage.exchange(run);
        exchanging = true;
      }
    }
  }
  complete();
}

}  // namespace mt
