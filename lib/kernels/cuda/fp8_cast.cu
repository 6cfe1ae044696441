// fp8_cast.cu: the amax by a grid-stride reduction (non-negative floats order as their bit patterns: one
// atomicMax on the bits per block; fmaxf skips NaN), the cast by tiles through shared memory so that both the
// row-major and the transposed outputs are written a row of a tile at a time: 64 x 64 with 8 values per load and
// store where the sizes and pointers allow, else 32 x 32 one value per thread; under delayed scaling the cast takes
// the scale given and gathers the amax of what it reads (a block reduction, one atomicMax per block).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "model/fp8_scaling.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

// vec8: x is 16-byte aligned and n a multiple of 8 (eight values per load).
__global__ void amax_kernel(const bf16* __restrict__ x, int64_t n, unsigned* __restrict__ amax_bits, bool vec8) {
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (vec8) {
    const uint4* v = reinterpret_cast<const uint4*>(x);
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n / 8; i += stride) {
      const uint4 u = v[i];
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(p[k]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  } else {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < static_cast<int>(blockDim.x >> 5) ? warp_max[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) atomicMax(amax_bits, __float_as_uint(m));
  }
}

constexpr int kTile = 32, kRowsPerPass = 8;

// The scale: *given (delayed scaling), else from *amax (tensorwise).
__device__ __forceinline__ float cast_scale(const float* given, const float* amax, bool e5m2) {
  return given ? *given : fp8_scale_from_amax(*amax, e5m2 ? 57344.0f : 448.0f);
}

// The vectorised cast: 64 x 64 tiles (kernels/cuda/fp8_tile.cuh), 256 threads, eight values per load and per
// store (rows and columns multiples of 8, x 16-byte aligned, the outputs 8-byte aligned).
// The format a template argument and the conversions in pairs (fewer instructions: see fp8_swiglu.cu).
template <__nv_fp8_interpretation_t kKind>
__global__ void __launch_bounds__(256) cast_vec_kernel(const bf16* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ amax,
                                                       const float* __restrict__ given, unsigned* __restrict__ acc, uint8_t* __restrict__ out,
                                                       uint8_t* __restrict__ out_t, float* __restrict__ scale_inv) {
  const float scale = cast_scale(given, amax, kKind == __NV_E5M2);
  float m = 0.0f;
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, scale);
  __shared__ alignas(16) uint8_t tile[kFp8Tile][kFp8TilePitch];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kFp8Tile, c0 = static_cast<int64_t>(blockIdx.x) * kFp8Tile;
  const int t = threadIdx.x, group = t % 8;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int i = t / 8 + 32 * pass;
    const int64_t r = r0 + i, c = c0 + group * 8;
    if (r < rows && c < cols) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + r * cols + c);
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&u);
      float f[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 v = __bfloat1622float2(p[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
        m = fmaxf(m, fmaxf(fabsf(v.x), fabsf(v.y)));
      }
      const uint2 q = make_uint2(to_fp8x4<kKind>(f[0], f[1], f[2], f[3], scale), to_fp8x4<kKind>(f[4], f[5], f[6], f[7], scale));
      if (out) *reinterpret_cast<uint2*>(out + r * cols + c) = q;
      *reinterpret_cast<uint2*>(&tile[i][group * 8]) = q;
    }
  }
  if (acc) block_amax_into(m, acc);
  if (!out_t) return;
  __syncthreads();
  store_tile_transposed(tile, out_t, c0, cols - c0, r0, rows);
}

__global__ void cast_kernel(const bf16* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ amax, const float* __restrict__ given,
                            unsigned* __restrict__ acc, bool e5m2, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                            float* __restrict__ scale_inv) {
  const float scale = cast_scale(given, amax, e5m2);
  float m = 0.0f;
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = __fdiv_rn(1.0f, scale);
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float xv = __bfloat162float(x[r * cols + c]);
      m = fmaxf(m, fabsf(xv));
      const uint8_t q = __nv_cvt_float_to_fp8(__fmul_rn(xv, scale), __NV_SATFINITE, kind);
      if (out) out[r * cols + c] = q;
      tile[i][threadIdx.x] = q;
    }
  }
  if (acc) block_amax_into(m, acc);
  if (!out_t) return;
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out_t row c, column r
    if (c < cols && r < rows) out_t[c * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void delayed_update_kernel(float* __restrict__ scale, float* __restrict__ history, int64_t n, int64_t stride, int64_t len,
                                      bool max_algo, float scaled_max) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) scale[i] = mt::fp8_delayed_update(history + i, stride, len, max_algo, scaled_max, scale[i]);
}

void cast(const bf16* x, int64_t rows, int64_t cols, const float* amax, const float* given, float* acc, Fp8Type type, uint8_t* out, uint8_t* out_t,
          float* scale_inv, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  unsigned* acc_bits = reinterpret_cast<unsigned*>(acc);
  const auto aligned = [](const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; };
  if (rows % 8 == 0 && cols % 8 == 0 && aligned(x, 16) && aligned(out, 8) && aligned(out_t, 8)) {
    const dim3 grid(static_cast<unsigned>((cols + kFp8Tile - 1) / kFp8Tile), static_cast<unsigned>((rows + kFp8Tile - 1) / kFp8Tile));
    if (type == Fp8Type::kE5M2) {
      cast_vec_kernel<__NV_E5M2><<<grid, 256, 0, stream>>>(x, rows, cols, amax, given, acc_bits, out, out_t, scale_inv);
    } else {
      cast_vec_kernel<__NV_E4M3><<<grid, 256, 0, stream>>>(x, rows, cols, amax, given, acc_bits, out, out_t, scale_inv);
    }
    MT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  cast_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(x, rows, cols, amax, given, acc_bits, type == Fp8Type::kE5M2, out, out_t, scale_inv);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fp8_amax(const bf16* x, int64_t n, float* amax, cudaStream_t stream) {
  MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n <= 0) return;
  const int threads = 512;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 1024);
  const bool vec8 = n % 8 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  amax_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, n, reinterpret_cast<unsigned*>(amax), vec8);
  MT_CUDA_CHECK(cudaGetLastError());
}

void fp8_cast(const bf16* x, int64_t rows, int64_t cols, const float* amax, Fp8Type type, uint8_t* out, uint8_t* out_t, float* scale_inv,
              cudaStream_t stream) {
  cast(x, rows, cols, amax, nullptr, nullptr, type, out, out_t, scale_inv, stream);
}

void fp8_cast_scaled(const bf16* x, int64_t rows, int64_t cols, const float* scale, float* amax_accumulator, Fp8Type type, uint8_t* out,
                     uint8_t* out_t, float* scale_inv, cudaStream_t stream) {
  cast(x, rows, cols, nullptr, scale, amax_accumulator, type, out, out_t, scale_inv, stream);
}

void fp8_delayed_update(float* scale, float* history, int64_t n, int64_t stride, int64_t len, bool max_algo, float scaled_max,
                        cudaStream_t stream) {
  if (n <= 0) return;
  const int threads = 128;
  delayed_update_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(scale, history, n, stride, len, max_algo,
                                                                                                    scaled_max);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
