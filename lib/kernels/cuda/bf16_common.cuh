// bf16_common.cuh (CUDA): the bf16 type and the block-wide reductions the mixed-precision kernels share.
#pragma once
#include "kernels/cuda/bf16_fwd.h"

#include <cstdint>

namespace mt::cuda {



__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x >> 5) ? part[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace mt::cuda
