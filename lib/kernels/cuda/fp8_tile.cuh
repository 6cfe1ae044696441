// fp8_tile.cuh (CUDA): the pieces of the tiled FP8 casts (kernels/cuda/fp8_cast.cu and the casts fused into the
// kernels that produce their inputs, kernels/cuda/fp8_swiglu.cu): one value's rounding, the block's amax into an
// accumulator, and a 64 x 64 tile of FP8 bytes written transposed.
#pragma once
#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>

namespace mt::cuda {

// 64 x 64 tiles, 256 threads, eight values per load and store; a tile row is padded so that the transposed reads
// of shared memory spread over the banks.
constexpr int kFp8Tile = 64, kFp8TilePitch = kFp8Tile + 8;

// The scale that maps amax to the format's largest value max (kernels/cpu/fp8's fp8_scale_from_amax): 1 for a zero or
// non-finite amax, FLT_MAX where max / amax overflows.
__device__ __forceinline__ float fp8_scale_from_amax(float amax, float max) {
  if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
  const float s = __fdiv_rn(max, amax);
  return isinf(s) ? FLT_MAX : s;
}

// x * scale rounded to nearest even, saturated to the format's largest finite value.
__device__ __forceinline__ uint8_t to_fp8(float x, float scale, __nv_fp8_interpretation_t kind) {
  return __nv_cvt_float_to_fp8(__fmul_rn(x, scale), __NV_SATFINITE, kind);
}

// The block's max |x| atomically into *acc (non-negative floats order as their bits); every thread must call it.
__device__ __forceinline__ void block_amax_into(float m, unsigned* acc) {
  __shared__ float warp_max[32];
  const int t = threadIdx.y * blockDim.x + threadIdx.x, lane = t & 31, warp = t >> 5;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>((blockDim.x * blockDim.y) >> 5) ? warp_max[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0 && m > 0.0f) atomicMax(acc, __float_as_uint(m));
  }
}

// The tile (rows r0.. of the input, its columns j = 0..63) as rows of the transposed output: out_t's row
// first_row + j gets the tile's column j at columns r0.. (out_t's leading dimension: rows). Columns j >= valid_cols
// and input rows >= rows are skipped; rows a multiple of 8, out_t 8-byte aligned. 256 threads (1-D), after a
// __syncthreads() that follows the tile's writes.
__device__ __forceinline__ void store_tile_transposed(const uint8_t (*tile)[kFp8TilePitch], uint8_t* __restrict__ out_t, int64_t first_row,
                                                      int64_t valid_cols, int64_t r0, int64_t rows) {
  const int t = threadIdx.x, group = t % 8;
  for (int pass = 0; pass < 2; ++pass) {
    const int j = t / 8 + 32 * pass;
    const int64_t r = r0 + group * 8;
    if (j < valid_cols && r < rows) {
      alignas(8) uint8_t q[8];
      for (int k = 0; k < 8; ++k) q[k] = tile[group * 8 + k][j];
      *reinterpret_cast<uint2*>(out_t + (first_row + j) * rows + r) = *reinterpret_cast<const uint2*>(q);
    }
  }
}

}  // namespace mt::cuda
