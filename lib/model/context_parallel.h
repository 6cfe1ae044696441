// context_parallel.h: Megatron's load-balanced split of each sequence over the context-parallel ranks: the
// sequence cut into 2 x CP chunks, rank r holding chunks r and 2 CP - 1 - r, so causal attention costs every rank
// the same (Megatron's get_batch_on_this_cp_rank).
#pragma once

#include <cstdint>

#include "model/model_dims.h"

namespace mt {

// The place in the sequence of local token s (of 2 x chunk) of CP rank `rank`, chunk = S / (2 CP).
inline int32_t context_parallel_position(int64_t s, int64_t rank, int64_t cp, int64_t chunk) {
  const int64_t which = s < chunk ? rank : 2 * cp - 1 - rank;
  return static_cast<int32_t>(which * chunk + s % chunk);
}

// This rank's tokens of a microbatch of whole sequences (S divisible by 2 x CP): tokens, labels, positions, loss
// mask and document starts of its two chunks per sequence, with their places in the sequence (seq_pos).
Microbatch context_parallel_slice(const Microbatch& whole, int64_t rank, int64_t cp);

// The place in the sequence of each of the microbatch's tokens: seq_pos under CP, else s.
inline int32_t sequence_position(const Microbatch& mb, int64_t t) {
  return mb.seq_pos.empty() ? static_cast<int32_t>(t % mb.S) : mb.seq_pos[static_cast<size_t>(t)];
}

}  // namespace mt
