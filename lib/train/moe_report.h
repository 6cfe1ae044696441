// moe_report.h: what an iteration's MoE layers report to the log line (Megatron's track_moe_metrics): the
// auxiliary losses averaged over microbatches, data-parallel ranks and MoE layers, and the tokens per expert.
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/cpu/pass_context.h"
#include "train/training_loop.h"

namespace mt {

// The log line's name of the load-balancing loss (Megatron's): load_balancing_loss, seq_load_balancing_loss or
// global_load_balancing_loss; empty when there is none (type none, or coefficient 0).
std::string balance_loss_name(const MoeConfig& m);

// Collective over the world (every rank of an MoE model calls it once per iteration).
void fill_moe_report(const Config& cfg, const ProcessGroups& groups, const cpu::MoeStats& stats, int64_t num_microbatches, StepReport& out);

}  // namespace mt
