// pipeline_plan.cpp: the schedules simulated for `megatrain plan`.
#include "plan/pipeline_plan.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "config/resolve.h"
#include "pipeline/configured_schedule.h"
#include "pipeline/schedule.h"

namespace mt {
namespace {

// Compute cost of one pass over a chunk: its layers, plus the output layer and loss on the last virtual
// stage (its GEMM is 2 V h FLOPs a token against a layer's ~24 h^2: V / 12h layers) and there multi-token
// prediction's modules (each a layer and the output layer again). F, B and W cost one unit each (Qi et al.'s
// assumption), a whole backward two.
ActionCost layer_costs(const Config& cfg, int64_t stages, int64_t chunks) {
  std::vector<int64_t> per = layers_per_virtual_stage(cfg);
  if (static_cast<int64_t>(per.size()) != stages * chunks) per.assign(static_cast<size_t>(stages * chunks), 1);
  const double h = static_cast<double>(cfg.model.hidden_size.value_or(1));
  const double output = static_cast<double>(cfg.derived.padded_vocab_size) / (12.0 * h);
  const double last = output + static_cast<double>(cfg.model.mtp_num_layers.value_or(0)) * (1.0 + output);
  return [per, last, stages, chunks](int64_t rank, const ScheduleAction& a) {
    const int64_t vs = a.chunk * stages + rank;
    double w = static_cast<double>(per[static_cast<size_t>(vs)]) + (vs == stages * chunks - 1 ? last : 0.0);
    if (a.kind == ActionKind::kBackward) w *= 2.0;
    return w;
  };
}

// The simulation runs at most this many microbatches (a multiple of the stages, or under interleaving of its group of
// microbatches): past the warm-up the lists repeat, so the idle time is what it is at any larger count, and the bubble
// of the real count follows from it.
constexpr int64_t kSimulatedMicrobatches = 512;
int64_t simulated_microbatches(int64_t M, int64_t unit, int64_t limit = kSimulatedMicrobatches) {
  if (M <= limit) return M;
  return std::max<int64_t>(unit, limit / unit * unit);
}

// Whether the interleaved schedule runs M microbatches in groups of G on P stages (Megatron's rules, as validation's).
bool interleaving_runs(int64_t P, int64_t M, int64_t G) { return G >= P && G <= M && (M % G == 0 || M % G >= P); }

ScheduleEstimate estimate(const Config& cfg, const std::string& schedule, int64_t chunks) {
  Config c = cfg;
  c.parallel.pipeline_schedule = schedule;
  const bool configured = chunks == virtual_stages_per_rank(cfg);
  if (!configured) {  // (another chunk count than the configured one: an even split into it, Megatron's default groups)
    c.parallel.pipeline_model_parallel_layout.reset();
    c.parallel.num_layers_per_virtual_pipeline_stage.reset();
    c.parallel.num_virtual_stages_per_pipeline_rank = chunks;
    c.parallel.microbatch_group_size_per_vp_stage.reset();
  }
  const int64_t P = c.parallel.pipeline_model_parallel_size, M_real = c.derived.num_microbatches;
  const int64_t unit = chunks > 1 ? microbatch_group_size(c) : P;  // (the simulated counts keep the groups whole)
  const int64_t M = simulated_microbatches(M_real, unit);
  ScheduleEstimate e;
  e.chunks = chunks;
  e.name = schedule == "zb-h1" ? "ZB-H1" : chunks > 1 ? "interleaved 1F1B (V = " + std::to_string(chunks) + ")" : "1F1B";
  if (P * M > 100000) {
    e.unavailable = "not simulated: " + std::to_string(P) + " stages are more than the planner runs";
    return e;
  }
  if (chunks > 1 && !interleaving_runs(P, M_real, unit)) {
    e.unavailable = unit == P ? "needs the microbatches (" + std::to_string(M_real) + ") a multiple of PP"
                              : "the microbatches (" + std::to_string(M_real) + ") do not fit groups of " + std::to_string(unit);
    return e;
  }
  for (int64_t r = 0; !configured && r < P; ++r) {  // (the configured split was validated; a layout sets each chunk's own)
    const auto& layers = layers_per_pipeline_stage(c);
    if (layers[static_cast<size_t>(r)] % chunks != 0) {
      e.unavailable = "needs each stage's layers divisible by " + std::to_string(chunks);
      return e;
    }
  }
  // Idle time at `count` microbatches (and the peaks in flight, at the largest count simulated).
  auto run = [&](int64_t count, bool keep_peaks) {
    std::vector<Schedule> lists;
    for (int64_t r = 0; r < P; ++r) {
      lists.push_back(training_schedule(c, r, P, count));
      if (keep_peaks) e.in_flight.push_back(peak_in_flight(lists.back()));
    }
    const PipelineTiming t = simulate_pipeline(lists, chunks, layer_costs(c, P, chunks));
    if (!t.error.empty()) throw std::logic_error("megatrain plan: the " + e.name + " schedule does not run: " + t.error);
    return std::make_pair(t.makespan * static_cast<double>(P) - t.busy, t.busy / static_cast<double>(count));
  };
  const auto [idle, busy_each] = run(M, true);
  double idle_real = idle;
  if (M_real > M && simulated_microbatches(M, unit, M / 2) < M) {
    // Past the warm-up the idle time grows linearly with the microbatches (by the stages' imbalance): from
    // two simulated counts to the real one.
    const int64_t half = simulated_microbatches(M, unit, M / 2);
    const double idle_half = run(half, false).first;
    const double slope = (idle - idle_half) / static_cast<double>(M - half);
    idle_real = idle + slope * static_cast<double>(M_real - M);
  }
  const double busy = busy_each * static_cast<double>(M_real);
  e.bubble = idle_real + busy > 0 ? idle_real / (idle_real + busy) : 0.0;
  return e;
}

}  // namespace

std::vector<ScheduleEstimate> pipeline_schedule_estimates(const Config& cfg) {
  std::vector<ScheduleEstimate> out;
  const int64_t P = cfg.parallel.pipeline_model_parallel_size;
  if (P < 2 || !cfg.model.num_layers) return out;
  const int64_t V = virtual_stages_per_rank(cfg);
  const std::string chosen = cfg.parallel.pipeline_schedule;
  out.push_back(estimate(cfg, chosen, chosen == "zb-h1" ? 1 : V));
  out.back().chosen = true;
  if (chosen == "zb-h1" || V > 1) out.push_back(estimate(cfg, "1f1b", 1));
  if (chosen != "zb-h1") out.push_back(estimate(cfg, "zb-h1", 1));
  if (V == 1) out.push_back(estimate(cfg, "1f1b", 2));  // what interleaving over two chunks would give
  return out;
}

double configured_in_flight(const Config& cfg, int64_t stage) {
  const int64_t P = cfg.parallel.pipeline_model_parallel_size;
  if (P < 2) return 1.0;
  const int64_t V = cfg.parallel.pipeline_schedule == "zb-h1" ? 1 : virtual_stages_per_rank(cfg);
  const int64_t unit = V > 1 ? microbatch_group_size(cfg) : P;
  const int64_t M = simulated_microbatches(cfg.derived.num_microbatches, unit);
  if (P * M > 100000) return static_cast<double>(std::min(P - stage, M));  // 1F1B's count, not simulated
  if (V > 1 && !interleaving_runs(P, cfg.derived.num_microbatches, unit)) return static_cast<double>(std::min(P - stage, M));  // not runnable: 1F1B's count
  return static_cast<double>(peak_in_flight(training_schedule(cfg, stage, P, M))) / static_cast<double>(V);
}

}  // namespace mt
