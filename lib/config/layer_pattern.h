// layer_pattern.h: Megatron's per-layer patterns (--moe-layer-freq, --no-rope-freq): an integer N, or a list
// expression of 0/1 per layer built from lists, '+' (concatenation), '*' (repetition) and parentheses, e.g.
// "[0]+[1]*3" or "([0]*3+[1]*1)*2".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

// What an integer N means: layer l is set when l % N == 0 (--moe-layer-freq), or when (l + 1) % N == 0 with N
// dividing the number of layers (--no-rope-freq: [0] * (N - 1) + [1], repeated), or when (l + 1) % N == 0 for any N
// (--window-attn-skip-freq's full-attention layers: Megatron's layer_number % N == 0).
enum class LayerEvery { kFirst, kLast, kLastAnyCount };

// The pattern of `flag` for `num_layers` layers (what = the meaning of 0 and of 1, for errors); throws ConfigError
// naming the problem (syntax, values other than 0/1, a length other than num_layers, N < 1).
// integer_form (optional): set to whether the text was the integer N (not a list).
std::vector<bool> parse_layer_pattern(const std::string& text, int64_t num_layers, const std::string& flag, LayerEvery every,
                                      const std::string& what, bool* integer_form = nullptr);

// --no-rope-freq (Llama 4's layers without RoPE): which layers skip RoPE (empty without the flag, or with 0: off, as in
// Megatron).
std::vector<bool> rope_skipped_layers(const Config& cfg);
// Whether --no-rope-freq is given and not 0.
bool rope_skipping_given(const Config& cfg);

}  // namespace mt
