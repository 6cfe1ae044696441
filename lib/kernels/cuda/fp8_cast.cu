// fp8_cast.cu: the amax by a grid-stride reduction (non-negative floats order as their bit patterns: one
// atomicMax on the bits per block), the cast by 32 x 32 tiles through shared memory so that both the row-major
// and the transposed outputs are written a row of a tile at a time.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/fp8_cast.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__device__ __forceinline__ float scale_from_amax(float amax, float max) {
  if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
  const float s = __fdiv_rn(max, amax);
  return isinf(s) ? FLT_MAX : s;
}

__global__ void amax_kernel(const bf16* __restrict__ x, int64_t n, unsigned* __restrict__ amax_bits) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
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

__global__ void cast_kernel(const bf16* __restrict__ x, int64_t rows, int64_t cols, const float* __restrict__ amax, bool e5m2,
                            uint8_t* __restrict__ out, uint8_t* __restrict__ out_t, float* __restrict__ scale_inv) {
  const float scale = scale_from_amax(*amax, e5m2 ? 57344.0f : 448.0f);
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale_inv = __fdiv_rn(1.0f, scale);
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = __fmul_rn(__bfloat162float(x[r * cols + c]), scale);
      const uint8_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
      if (out) out[r * cols + c] = q;
      tile[i][threadIdx.x] = q;
    }
  }
  if (!out_t) return;
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out_t row c, column r
    if (c < cols && r < rows) out_t[c * rows + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

void fp8_amax(const bf16* x, int64_t n, float* amax, cudaStream_t stream) {
  MT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n <= 0) return;
  const int threads = 512;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 1024);
  amax_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, n, reinterpret_cast<unsigned*>(amax));
  MT_CUDA_CHECK(cudaGetLastError());
}

void fp8_cast(const bf16* x, int64_t rows, int64_t cols, const float* amax, Fp8Type type, uint8_t* out, uint8_t* out_t, float* scale_inv,
              cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  cast_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(x, rows, cols, amax, type == Fp8Type::kE5M2, out, out_t, scale_inv);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
