// dropout.cuh (CUDA): the per-element keep factor of a RowDropout, for kernels that fuse dropout.
#pragma once
#include "kernels/cuda/dropout.h"
#include "tensor/rng.h"

namespace mt::cuda {

// 1 / (1 - p) where element (row, col) of a [rows, h] block is kept, else 0.
__device__ __forceinline__ float dropout_factor(const RowDropout& d, int64_t row, int64_t col, int64_t h) {
  const int64_t t = d.t0 + row, s = t % d.S, c = d.S / 2;
  const int64_t pos = d.cp > 1 ? (s < c ? d.cp_rank : 2 * d.cp - 1 - d.cp_rank) * c + s % c : s;  // the place in the sequence
  const uint64_t key = d.keys[(t / d.S) * d.stride + d.site];
  const bool keep = philox_uniform(key, static_cast<uint64_t>(pos * h + col)) >= d.p;
  return keep ? 1.0f / (1.0f - d.p) : 0.0f;
}

}  // namespace mt::cuda
