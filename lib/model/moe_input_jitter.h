// moe_input_jitter.h: --moe-input-jitter-eps (Megatron's router input jitter, after Switch Transformer): the router's
// input multiplied by noise uniform in [1 - eps, 1 + eps], drawn anew for every token (the experts take the input
// as it was). Each factor is a pure function of the token's place (its sample and its position in the sequence), the
// layer and the channel, so every layout (TP, SP, EP, CP, PP) draws the same noise for the same token. Megatron draws
// it from torch's generator, in training and evaluation alike (as here), so the values themselves differ from Megatron's.
#pragma once

#include <cstdint>

#include "tensor/rng.h"

namespace mt {

inline uint64_t moe_input_jitter_key(uint64_t seed) { return rng_key(seed, "moe-input-jitter"); }

// The factor of `channel` (of `hidden`) for the token at `position` of sample `sample` (sequences of seq_length) in
// global layer `layer`.
MT_HD float moe_input_jitter(uint64_t key, float eps, int64_t layer, int64_t sample, int64_t position, int64_t seq_length, int64_t hidden,
                             int64_t channel) {
  const float u = philox_uniform(key, static_cast<uint64_t>((sample * seq_length + position) * hidden + channel), static_cast<uint64_t>(layer));
  return 1.0f - eps + 2.0f * eps * u;
}

}  // namespace mt
