// fp8_swiglu.cu: SwiGLU and its backward with the FP8 cast of what they produce, in 64 x 64 tiles of SwiGLU's
// output columns (kernels/cuda/fp8_tile.cuh): each thread computes eight values of a row from one 16-byte load of
// each input, rounds them to bf16, casts them, writes the row-major bytes and keeps them in the tile that is then
// written transposed. The backward's tile covers a gate column block and the matching up column block at once, so
// gate, up and dy are each read once.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/fp8_swiglu.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/swiglu_math.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

// Two values rounded to bf16 (one paired conversion) and back to fp32.
__device__ __forceinline__ void round_bf16x2(float& a, float& b) {
  const float2 r = __bfloat1622float2(__float22bfloat162_rn(make_float2(a, b)));
  a = r.x;
  b = r.y;
}

// kParts 1: the forward (y [rows, F]); 2: the backward (dx [rows, 2F]: part 0 the gate's columns, part 1 the up's).
// The format a template argument and the conversions in pairs: the kernel is bound by its instruction issue otherwise
// (Nsight Compute: 69% of issue slots busy, DRAM at 64% of its bandwidth, against the bf16 SwiGLU's 82%).
template <int kParts, __nv_fp8_interpretation_t kKind>
__global__ void __launch_bounds__(256) swiglu_cast_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x, int64_t rows, int64_t F,
                                                          const float* __restrict__ scale_ptr, unsigned* __restrict__ acc, uint8_t* __restrict__ out,
                                                          uint8_t* __restrict__ out_t, float* __restrict__ scale_inv, bf16* __restrict__ y16) {
  const float scale = *scale_ptr;
  if (scale_inv && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, scale);
  __shared__ alignas(16) uint8_t tile[kParts][kFp8Tile][kFp8TilePitch];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kFp8Tile, c0 = static_cast<int64_t>(blockIdx.x) * kFp8Tile;
  const int64_t out_cols = kParts * F;
  const int t = threadIdx.x, group = t % 8;
  float m = 0.0f;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int i = t / 8 + 32 * pass;
    const int64_t r = r0 + i, c = c0 + group * 8;
    if (r < rows && c < F) {
      const Bf16x8 g = load_bf16x8(x + r * 2 * F + c), u = load_bf16x8(x + r * 2 * F + F + c);
      Bf16x8 v[kParts];
      if constexpr (kParts == 1) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[0].x[k] = swiglu_value(g.x[k], u.x[k]);
      } else {
        const Bf16x8 d = load_bf16x8(dy + r * F + c);
#pragma unroll
        for (int k = 0; k < 8; ++k) swiglu_grads(d.x[k], g.x[k], u.x[k], v[0].x[k], v[1].x[k]);
      }
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
#pragma unroll
        for (int k = 0; k < 8; k += 2) round_bf16x2(v[p].x[k], v[p].x[k + 1]);
        if (kParts == 1 && y16) store_bf16x8(y16 + r * F + c, v[0]);
        uint2 q;
        q.x = to_fp8x4<kKind>(v[p].x[0], v[p].x[1], v[p].x[2], v[p].x[3], scale);
        q.y = to_fp8x4<kKind>(v[p].x[4], v[p].x[5], v[p].x[6], v[p].x[7], scale);
#pragma unroll
        for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(v[p].x[k]));
        if (out) *reinterpret_cast<uint2*>(out + r * out_cols + p * F + c) = q;
        *reinterpret_cast<uint2*>(&tile[p][i][group * 8]) = q;
      }
    }
  }
  if (acc) block_amax_into(m, acc);
  if (!out_t) return;
  __syncthreads();
  for (int p = 0; p < kParts; ++p) store_tile_transposed(tile[p], out_t, p * F + c0, F - c0, r0, rows);
}

bool aligned(const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

template <int kParts>
bool launch(const bf16* dy, const bf16* x, int64_t rows, int64_t F, const Fp8CastTarget& t, bf16* y16, cudaStream_t stream) {
  if (rows <= 0 || F <= 0) return true;
  if (rows % 8 != 0 || F % 8 != 0 || !aligned(x, 16) || !aligned(dy, 16) || !aligned(y16, 16) || !aligned(t.out, 8) || !aligned(t.out_t, 8) ||
      (rows + kFp8Tile - 1) / kFp8Tile > 65535) {
    return false;
  }
  const dim3 grid(static_cast<unsigned>((F + kFp8Tile - 1) / kFp8Tile), static_cast<unsigned>((rows + kFp8Tile - 1) / kFp8Tile));
  auto* acc = reinterpret_cast<unsigned*>(t.amax_accumulator);
  if (t.type == Fp8Type::kE5M2) {
    swiglu_cast_kernel<kParts, __NV_E5M2><<<grid, 256, 0, stream>>>(dy, x, rows, F, t.scale, acc, t.out, t.out_t, t.scale_inv, y16);
  } else {
    swiglu_cast_kernel<kParts, __NV_E4M3><<<grid, 256, 0, stream>>>(dy, x, rows, F, t.scale, acc, t.out, t.out_t, t.scale_inv, y16);
  }
  MT_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace

bool fp8_swiglu_forward_cast(const bf16* x, int64_t rows, int64_t F, const Fp8CastTarget& t, bf16* y16, cudaStream_t stream) {
  return launch<1>(nullptr, x, rows, F, t, y16, stream);
}

bool fp8_swiglu_backward_cast(const bf16* dy, const bf16* x, int64_t rows, int64_t F, const Fp8CastTarget& t, cudaStream_t stream) {
  if (dy == nullptr) return false;
  return launch<2>(dy, x, rows, F, t, nullptr, stream);
}

}  // namespace mt::cuda
