// moe_report.h: what an iteration's MoE layers report to the log line (Megatron's track_moe_metrics): the
// auxiliary losses averaged over microbatches, data-parallel ranks and MoE layers, and the tokens per expert.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/cpu/pass_context.h"
#include "train/training_loop.h"

namespace mt {

// The load-balancing losses a run logs (Megatron's names and order): (index in config.h's kAuxLossTypes, name) of each
// chosen type with a coefficient > 0 (load_balancing_loss, seq_load_balancing_loss, global_load_balancing_loss); none
// with type none or sinkhorn.
std::vector<std::pair<size_t, std::string>> logged_balance_losses(const MoeConfig& m);

// The per-layer losses' slots: the three load-balancing losses (kAuxLossTypes' order), then the z-loss.
inline constexpr size_t kMoeLossSlots = 4;

// --moe-per-layer-logging: per_layer holds [kMoeLossSlots][num_layers] (the losses' sums, by global layer index); each
// named loss present in the log line gets its layers' values times `scale` in out.moe_layer_losses.
void add_layer_losses(const MoeConfig& m, const std::vector<double>& per_layer, double scale, StepReport& out);

// Collective over the world (every rank of an MoE model calls it once per iteration).
void fill_moe_report(const Config& cfg, const ProcessGroups& groups, const cpu::MoeStats& stats, int64_t num_microbatches, StepReport& out);

}  // namespace mt
