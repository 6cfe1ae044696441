// configured_schedule.cpp: from the pipeline flags to a schedule.
#include "pipeline/configured_schedule.h"

#include "config/resolve.h"

namespace mt {

int64_t microbatch_group_size(const Config& cfg) {
  return cfg.parallel.microbatch_group_size_per_vp_stage.value_or(cfg.parallel.pipeline_model_parallel_size);
}

Schedule training_schedule(const Config& cfg, int64_t rank, int64_t stages, int64_t num_microbatches) {
  if (stages == 1) return no_pipelining_schedule(num_microbatches);
  if (cfg.parallel.pipeline_schedule == "zb-h1") return zero_bubble_h1_schedule(rank, stages, num_microbatches);
  return interleaved_schedule(rank, stages, virtual_stages_per_rank(cfg), num_microbatches, microbatch_group_size(cfg));
}

Schedule evaluation_schedule(const Config& cfg, int64_t rank, int64_t stages, int64_t num_microbatches) {
  return forward_only_schedule(rank, stages, num_microbatches, stages == 1 ? 1 : virtual_stages_per_rank(cfg), microbatch_group_size(cfg));
}

std::string schedule_name(const Config& cfg) {
  if (cfg.parallel.pipeline_model_parallel_size == 1) return "no pipelining";
  if (cfg.parallel.pipeline_schedule == "zb-h1") return "ZB-H1";
  const int64_t V = virtual_stages_per_rank(cfg);
  return V > 1 ? "interleaved 1F1B (" + std::to_string(V) + " virtual stages per rank)" : "1F1B";
}

}  // namespace mt
