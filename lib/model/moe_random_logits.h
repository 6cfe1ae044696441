// moe_random_logits.h: --moe-router-force-load-balancing (Megatron's benchmarking aid): the router's logits replaced by
// standard normal values, so that the top-k is uniform over the experts and their load balanced, with the gradient
// passing straight through to the router (Megatron's RandomSTE: the backward treats the random logits as the router's).
// Each value is a pure function of the token's place (its sample and its position in the sequence), the layer and the
// expert, so both engines and every layout (TP, SP, EP, CP, PP) draw the same logits for the same token.
#pragma once

#include <cstdint>

#include "tensor/rng.h"

namespace mt {

inline uint64_t moe_random_logits_key(uint64_t seed) { return rng_key(seed, "moe-router-force-load-balancing"); }

// The logit of `expert` (of `experts`) for the token at `position` of sample `sample` (sequences of seq_length) in
// global layer `layer`.
MT_HD float moe_random_logit(uint64_t key, int64_t layer, int64_t sample, int64_t position, int64_t seq_length, int64_t experts, int64_t expert) {
  return philox_normal(key, static_cast<uint64_t>((sample * seq_length + position) * experts + expert), static_cast<uint64_t>(layer));
}

}  // namespace mt
