// moe_pattern.cpp: --moe-layer-freq through config/layer_pattern.h.
#include "config/moe_pattern.h"

#include <algorithm>

#include "config/layer_pattern.h"

namespace mt {

std::vector<bool> parse_moe_layer_freq(const std::string& given, int64_t num_layers) {
  return parse_layer_pattern(given, num_layers, "moe-layer-freq", LayerEvery::kFirst, "0 (dense) or 1 (MoE)");
}

std::vector<bool> moe_layer_pattern(const Config& cfg) {
  const int64_t L = cfg.model.num_layers.value_or(0);
  if (!cfg.moe.num_experts) return std::vector<bool>(static_cast<size_t>(std::max<int64_t>(0, L)), false);
  return parse_moe_layer_freq(cfg.moe.moe_layer_freq, L);
}

bool is_moe_layer(const Config& cfg, int64_t layer) {
  if (!cfg.moe.num_experts) return false;
  const std::vector<bool> p = moe_layer_pattern(cfg);
  return layer >= 0 && layer < static_cast<int64_t>(p.size()) && p[static_cast<size_t>(layer)];
}

}  // namespace mt
