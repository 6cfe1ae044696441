// attention_window.h: sliding-window attention, Megatron's --window-size and --window-attn-skip-freq. A window (L, R)
// lets query i attend to keys i - L .. i + R (-1: unbounded); megatrain's models are causal, so R is 0. Without
// --window-attn-skip-freq every layer has the window; an integer N gives every N-th layer (the last of each N: layer
// numbers divisible by N, counted from 1) full attention; a list such as "([1]*3+[0])*2" has one entry per layer, 1
// for the window (Megatron's is_layer_window_attention).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

struct AttentionWindowSize {
  int64_t left = -1, right = -1;
};

// "L,R" or "(L,R)"; throws ConfigError naming the problem.
AttentionWindowSize parse_window_size(const std::string& text);

// Per global layer, the left bound L of its window (keys i - L .. i), -1 where the layer attends to every earlier key;
// empty when no layer has a window (no --window-size, or an unbounded left side). Throws ConfigError on a bad value.
std::vector<int64_t> attention_windows(const Config& cfg);

}  // namespace mt
