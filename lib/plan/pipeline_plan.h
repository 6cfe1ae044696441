// pipeline_plan.h: what `megatrain plan` says about the pipeline schedules: each schedule's bubble, from a
// run of the very lists the engines execute (pipeline/schedule.h simulate_pipeline) with compute costs from
// the stages' layers, and each stage's activations in flight from the same lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

struct ScheduleEstimate {
  std::string name;              // "1F1B", "interleaved 1F1B (V = 2)", "ZB-H1"
  bool chosen = false;           // the configured one
  std::string unavailable;       // why this configuration cannot run it (empty: it can)
  double bubble = 0;             // idle fraction of the pipeline's time
  int64_t chunks = 1;            // model chunks per rank
  std::vector<int64_t> in_flight;  // per stage: the most (microbatch, chunk) activations held at once
};

// The configured schedule first, then the others (PP > 1; empty at PP 1).
std::vector<ScheduleEstimate> pipeline_schedule_estimates(const Config& cfg);
// The configured schedule's activations in flight on `stage`, counted in microbatches of the whole stage
// (an interleaved chunk's activations are 1 / V of the stage's): 1 at PP 1.
double configured_in_flight(const Config& cfg, int64_t stage);

}  // namespace mt
