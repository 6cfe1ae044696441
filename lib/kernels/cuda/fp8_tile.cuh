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

// Four values x * scale rounded and saturated as to_fp8, in two paired conversions (one instruction per pair on
// sm_89 and later), value k in byte k.
template <__nv_fp8_interpretation_t kKind>
__device__ __forceinline__ uint32_t to_fp8x4(float a, float b, float c, float d, float scale) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, scale), __fmul_rn(b, scale)), __NV_SATFINITE, kKind);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(c, scale), __fmul_rn(d, scale)), __NV_SATFINITE, kKind);
  return lo | (hi << 16);
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
// and input rows >= rows are skipped; rows a multiple of 8, out_t 4-byte aligned. 256 threads (1-D), after a
// __syncthreads() that follows the tile's writes. Each thread reads a 4 x 4 block of bytes as four 4-byte words
// (rows 4g..4g+3 of tile columns 4q..4q+3), transposes it in registers, and writes four 4-byte runs: one shared-memory
// load per four output bytes (a byte a load before), and each warp still writes 64 contiguous bytes of a row.
__device__ __forceinline__ void store_tile_transposed(const uint8_t (*tile)[kFp8TilePitch], uint8_t* __restrict__ out_t, int64_t first_row,
                                                      int64_t valid_cols, int64_t r0, int64_t rows) {
  const int t = threadIdx.x, g = t % 16, q = t / 16;
  const int64_t r = r0 + 4 * g;
  if (r >= rows) return;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) w[k] = *reinterpret_cast<const uint32_t*>(&tile[4 * g + k][4 * q]);
  // w[k]'s byte c is the tile's (row 4g + k, column 4q + c); column c's output run is bytes c of w[0..3] in order.
  const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
  const uint32_t lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
  const uint32_t runs[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632), __byte_perm(hi01, hi23, 0x5410),
                            __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int j = 4 * q + c;
    if (j < valid_cols) *reinterpret_cast<uint32_t*>(out_t + (first_row + j) * rows + r) = runs[c];
  }
}

}  // namespace mt::cuda
