// bf16_common.cuh (CUDA): the bf16 type and the block-wide reductions the mixed-precision kernels share.
#pragma once
#include "kernels/cuda/bf16_fwd.h"

#include <cstdint>

namespace mt::cuda {

// The kernels are templates over the 16-bit type T16 (__nv_bfloat16 or __half), with fp32 math.
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(float x) { return x; }
template <typename T16>
__device__ __forceinline__ T16 from_f(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
// A bf16*-typed buffer read as fp16 (the launchers' dispatch).
inline __half* hp(bf16* p) { return reinterpret_cast<__half*>(p); }
inline const __half* hp(const bf16* p) { return reinterpret_cast<const __half*>(p); }

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

// Eight 16-bit values as floats, moved with one 16-byte load / store (the pointer 16-byte aligned).
struct Bf16x8 {
  float x[8];
};
template <typename T16>
__device__ __forceinline__ Bf16x8 load_bf16x8(const T16* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const T16* e = reinterpret_cast<const T16*>(&u);
  Bf16x8 v;
#pragma unroll
  for (int k = 0; k < 8; ++k) v.x[k] = to_f(e[k]);
  return v;
}
template <typename T16>
__device__ __forceinline__ void store_bf16x8(T16* p, const Bf16x8& v) {
  uint4 u;
  T16* e = reinterpret_cast<T16*>(&u);
#pragma unroll
  for (int k = 0; k < 8; ++k) e[k] = from_f<T16>(v.x[k]);
  *reinterpret_cast<uint4*>(p) = u;
}

// out[c] += sum over b of partials[b * n + c], in a fixed order (the second pass of the deterministic
// column reductions: weight and bias gradients).
__global__ inline void add_column_sums_kernel(float* out, const float* partials, int64_t blocks, int64_t n) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= n) return;
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += partials[b * n + c];
  out[c] += s;
}

// 16-byte aligned: the eight-wide loads and stores apply.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

inline unsigned grid_for(int64_t n, int threads, int64_t cap = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

}  // namespace mt::cuda
