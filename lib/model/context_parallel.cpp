// context_parallel.cpp: see context_parallel.h.
#include "model/context_parallel.h"

#include <stdexcept>
#include <string>

namespace mt {

Microbatch context_parallel_slice(const Microbatch& whole, int64_t rank, int64_t cp) {
  if (cp <= 1) return whole;
  if (whole.S % (2 * cp) != 0 || !whole.seq_pos.empty()) {
    throw std::logic_error("context_parallel_slice: sequence length " + std::to_string(whole.S) + " is not a multiple of 2 x CP, or already split");
  }
  const int64_t chunk = whole.S / (2 * cp), S = 2 * chunk;
  Microbatch mb;
  mb.B = whole.B;
  mb.S = S;
  mb.first_sample = whole.first_sample;
  mb.seq_total = whole.S;
  const auto n = static_cast<size_t>(whole.B * S);
  mb.tokens.resize(n);
  mb.labels.resize(n);
  mb.positions.resize(n);
  mb.loss_mask.resize(n);
  mb.seq_pos.resize(n);
  if (!whole.row_start.empty()) mb.row_start.resize(n);
  if (!whole.rope_positions.empty()) mb.rope_positions.resize(n);
  for (int64_t b = 0; b < whole.B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const int32_t pos = context_parallel_position(s, rank, cp, chunk);
      const auto from = static_cast<size_t>(b * whole.S + pos), to = static_cast<size_t>(b * S + s);
      mb.tokens[to] = whole.tokens[from];
      mb.labels[to] = whole.labels[from];
      mb.positions[to] = whole.positions[from];
      mb.loss_mask[to] = whole.loss_mask[from];
      mb.seq_pos[to] = pos;
      if (!whole.row_start.empty()) mb.row_start[to] = whole.row_start[from];
      if (!whole.rope_positions.empty()) mb.rope_positions[to] = whole.rope_positions[from];
    }
  }
  for (const Microbatch& shifted : whole.mtp) mb.mtp.push_back(context_parallel_slice(shifted, rank, cp));  // (multi-token prediction's)
  return mb;
}

}  // namespace mt
