// configured_schedule.h: the schedule the configuration asks for on one pipeline rank: no pipelining at PP 1,
// Megatron's 1F1B, its interleaved form with virtual stages, or ZB-H1 (--pipeline-schedule zb-h1).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "pipeline/schedule.h"

namespace mt {

// The interleaved schedule's microbatches per virtual-stage group: --microbatch-group-size-per-virtual-pipeline-stage, or
// the pipeline size (Megatron's default).
int64_t microbatch_group_size(const Config& cfg);
// One training iteration of num_microbatches on pipeline rank `rank` of `stages`.
Schedule training_schedule(const Config& cfg, int64_t rank, int64_t stages, int64_t num_microbatches);
// The forwards of an evaluation iteration.
Schedule evaluation_schedule(const Config& cfg, int64_t rank, int64_t stages, int64_t num_microbatches);
// The schedule's name as the log and `megatrain plan` print it ("1F1B", "interleaved 1F1B (V = 2)", "ZB-H1", ...).
std::string schedule_name(const Config& cfg);

}  // namespace mt
