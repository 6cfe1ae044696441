// moe_report.h: what an iteration's MoE layers report to the log line (Megatron's track_moe_metrics): the
// auxiliary losses averaged over microbatches, data-parallel ranks and MoE layers, and the tokens per expert.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/cpu/pass_context.h"
#include "train/training_loop.h"

namespace mt {

// Collective over the world (every rank of an MoE model calls it once per iteration).
void fill_moe_report(const Config& cfg, const ProcessGroups& groups, const cpu::MoeStats& stats, int64_t num_microbatches, StepReport& out);

}  // namespace mt
