// moe_report.cpp: see moe_report.h.
#include "train/moe_report.h"

#include <algorithm>

#include "config/moe_pattern.h"

namespace mt {

std::vector<std::pair<size_t, std::string>> logged_balance_losses(const MoeConfig& m) {
  std::vector<std::pair<size_t, std::string>> out;
  for (size_t i = 0; i < 3; ++i) {
    if (m.aux_loss_coeff(kAuxLossTypes[i]) > 0) out.emplace_back(i, kAuxLossNames[i]);
  }
  return out;
}

void add_layer_losses(const MoeConfig& m, const std::vector<double>& per_layer, double scale, StepReport& out) {
  const size_t L = per_layer.size() / kMoeLossSlots;
  auto named = [&](const std::string& name, size_t slot) {
    std::vector<double> v(per_layer.begin() + static_cast<std::ptrdiff_t>(slot * L), per_layer.begin() + static_cast<std::ptrdiff_t>((slot + 1) * L));
    for (double& x : v) x *= scale;
    out.moe_layer_losses.emplace_back(name, std::move(v));
  };
  for (const auto& [slot, name] : logged_balance_losses(m)) named(name, slot);
  if (m.moe_z_loss_coeff.value_or(0.0) > 0) named("z_loss", 3);
}

void fill_moe_report(const Config& cfg, const ProcessGroups& groups, const cpu::MoeStats& stats, int64_t num_microbatches, StepReport& out) {
  const MoeConfig& m = cfg.moe;
  if (!m.num_experts) return;
  double moe_layers = 0;
  const std::vector<bool> pattern = moe_layer_pattern(cfg);
  for (bool b : pattern) moe_layers += b ? 1 : 0;
  // (multi-token prediction's layers, of the last layer's kind, count as Megatron counts them: layers L, L + 1, ...)
  const int64_t mtp = !pattern.empty() && pattern.back() ? cfg.model.mtp_num_layers.value_or(0) : 0;
  moe_layers += static_cast<double>(mtp);
  double losses[kMoeLossSlots] = {0, 0, 0, 0};  // the load-balancing losses (kAuxLossTypes' order), z
  double counts[3] = {0, 0, 0};  // dropped, routed, routing digest
  double lo = 1e300, hi = 0, sum = 0, n = 0;
  for (const auto& [layer, st] : stats) {
    for (size_t i = 0; i < 3; ++i) losses[i] += st.aux[i];
    losses[3] += st.z;
    counts[0] += st.dropped;
    counts[1] += st.routed;
    counts[2] += st.routing_digest;
  }
  // Tokens per expert of each layer over the stage's ranks (TP shards and data-parallel replicas).
  for (const auto& [layer, st] : stats) {
    std::vector<double> tokens = st.tokens;
    tokens.resize(static_cast<size_t>(*m.num_experts), 0.0);
    groups.tp->all_reduce(tokens.data(), static_cast<int64_t>(tokens.size()), ReduceOp::kSum);
    groups.dp_cp->all_reduce(tokens.data(), static_cast<int64_t>(tokens.size()), ReduceOp::kSum);
    for (double t : tokens) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
      sum += t;
      n += 1;
    }
  }
  groups.tp->all_reduce(counts, 3, ReduceOp::kSum);
  groups.dp_cp->all_reduce(counts, 3, ReduceOp::kSum);
  groups.pp->all_reduce(losses, kMoeLossSlots, ReduceOp::kSum);
  groups.pp->all_reduce(counts, 3, ReduceOp::kSum);
  double extremes[2] = {-lo, hi}, totals[2] = {sum, n};
  groups.pp->all_reduce(extremes, 2, ReduceOp::kMax);
  groups.pp->all_reduce(totals, 2, ReduceOp::kSum);
  groups.dp_cp->all_reduce(losses, kMoeLossSlots, ReduceOp::kAvg);
  const double scale = 1.0 / (static_cast<double>(std::max<int64_t>(1, num_microbatches)) * std::max(1.0, moe_layers));
  for (const auto& [slot, name] : logged_balance_losses(m)) out.moe_losses.emplace_back(name, losses[slot] * scale);
  if (m.moe_z_loss_coeff.value_or(0.0) > 0) out.moe_losses.emplace_back("z_loss", losses[3] * scale);
  if (m.moe_per_layer_logging) {  // each layer's (every stage's layers: summed over PP, averaged over DP x CP as the totals)
    const size_t L = static_cast<size_t>(cfg.model.num_layers.value_or(0) + mtp);
    std::vector<double> per_layer(kMoeLossSlots * L, 0.0);
    for (const auto& [layer, st] : stats) {
      if (layer < 0 || static_cast<size_t>(layer) >= L) continue;
      for (size_t i = 0; i < 3; ++i) per_layer[i * L + static_cast<size_t>(layer)] = st.aux[i];
      per_layer[3 * L + static_cast<size_t>(layer)] = st.z;
    }
    groups.pp->all_reduce(per_layer.data(), static_cast<int64_t>(per_layer.size()), ReduceOp::kSum);
    groups.dp_cp->all_reduce(per_layer.data(), static_cast<int64_t>(per_layer.size()), ReduceOp::kAvg);
    add_layer_losses(m, per_layer, 1.0 / static_cast<double>(std::max<int64_t>(1, num_microbatches)), out);
  }
  if (totals[1] > 0) {
    out.expert_tokens_min = -extremes[0];
    out.expert_tokens_max = extremes[1];
    out.expert_tokens_mean = totals[0] / totals[1];
    out.dropped_fraction = counts[1] > 0 ? counts[0] / counts[1] : 0;
    out.routing_digest = counts[2];
  }
}

}  // namespace mt
