// moe_report.h: what an iteration's MoE layers report to the log line (Megatron's track_moe_metrics): the
// auxiliary losses averaged over microbatches, data-parallel ranks and MoE layers, and the tokens per expert.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/cpu/pass_context.h"
#include "train/training_loop.h"

namespace mt {

// The log line's name of the load-balancing loss (Megatron's): load_balancing_loss, seq_load_balancing_loss or
// global_load_balancing_loss; empty when there is none (type none, or coefficient 0).
std::string balance_loss_name(const MoeConfig& m);

// --moe-per-layer-logging: per_layer holds [2][num_layers] (the load-balancing and z losses' sums, by global layer
// index); each named loss present in the log line gets its layers' values times `scale` in out.moe_layer_losses.
void add_layer_losses(const MoeConfig& m, const std::vector<double>& per_layer, double scale, StepReport& out);

// Collective over the world (every rank of an MoE model calls it once per iteration).
void fill_moe_report(const Config& cfg, const ProcessGroups& groups, const cpu::MoeStats& stats, int64_t num_microbatches, StepReport& out);

}  // namespace mt
