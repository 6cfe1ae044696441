// moe_pattern.h: which transformer layers are MoE layers, from --moe-layer-freq as Megatron reads it: an
// integer N (layer l is MoE when l % N == 0), or a list expression of 0/1 per layer built from lists,
// '+' (concatenation), '*' (repetition) and parentheses, e.g. "[0]+[1]*3" or "([0]*3+[1]*1)*2".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

// The pattern for `num_layers` layers; throws ConfigError naming the problem (syntax, values other than 0/1,
// a length other than num_layers, N < 1).
std::vector<bool> parse_moe_layer_freq(const std::string& text, int64_t num_layers);
// The configured model's pattern: all false without --num-experts.
std::vector<bool> moe_layer_pattern(const Config& cfg);
// Whether global layer `layer` is an MoE layer (false without --num-experts).
bool is_moe_layer(const Config& cfg, int64_t layer);

}  // namespace mt
