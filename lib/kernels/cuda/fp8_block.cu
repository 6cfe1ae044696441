// fp8_block.cu: blockwise FP8 quantisation in 128 x 128 tiles of the input, staged in shared memory (one 16-byte
// load per 8 values): a warp takes 16 of the tile's rows for the 1 x 128 blocks along rows (each lane 4 values, the
// row's amax by a warp reduction) and 16 of its columns for the blocks of 128 rows of one column, written straight
// into the transposed output; a 128 x 128 block takes the tile's amax by a block reduction and writes both layouts.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/fp8_tile.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kB = static_cast<int>(kFp8BlockSize), kPitch = kB + 8;  // the tile's row pitch in bf16 (272 bytes: 16-byte rows)

__host__ __device__ int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }
__host__ __device__ int64_t blocks(int64_t n) { return (n + kB - 1) / kB; }

// The power-of-2 scale of a block (kernels/cpu/fp8's fp8_block_scale): the amax's scale rounded down to 2^k.
__device__ __forceinline__ float block_scale(float amax, float max) {
  return __uint_as_float(__float_as_uint(fp8_scale_from_amax(amax, max)) & 0xFF800000u);
}

__device__ __forceinline__ float warp_max(float m) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// The scale of a 1 x 128 block whose 128 values the warp's lanes hold four each (a warp-wide amax); lane 0 writes its
// inverse to *inv unless inv is null (a row or column past the tensor's edge).
__device__ __forceinline__ float warp_block_scale(const float (&v)[4], float fmax, float* inv) {
  const float s = block_scale(warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])))), fmax);
  if (inv != nullptr && (threadIdx.x & 31) == 0) *inv = __fdiv_rn(1.0f, s);
  return s;
}

// Four values quantised with one scale, packed for one 4-byte store.
__device__ __forceinline__ uint32_t quantize4(const float (&v)[4], float scale, __nv_fp8_interpretation_t kind) {
  uint32_t q = 0;
  for (int k = 0; k < 4; ++k) q |= static_cast<uint32_t>(to_fp8(v[k], scale, kind)) << (8 * k);
  return q;
}

// kSquare: one 128 x 128 block per tile (scale_inv blk128 of (rows, cols), t_scale_inv blk128 of (cols, rows)); else
// 1 x 128 blocks along rows (out, scale_inv: vec128 of (rows, cols)) and 128 x 1 blocks along columns (out_t,
// t_scale_inv: vec128 of (cols, rows)).
template <bool kSquare>
__global__ void quantize_tile_kernel(const bf16* __restrict__ x, int64_t rows, int64_t cols, bool e5m2, uint8_t* __restrict__ out,
                                     float* __restrict__ scale_inv, uint8_t* __restrict__ out_t, float* __restrict__ t_scale_inv) {
  __shared__ alignas(16) bf16 tile[kB][kPitch];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kB, c0 = static_cast<int64_t>(blockIdx.x) * kB;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  float m = 0.0f;
  for (int i = 0; i < kB * kB / 8 / 256; ++i) {  // 2,048 runs of 8, eight per thread; past the edges: zeros
    const int id = t + 256 * i, rr = id >> 4, cc = (id & 15) * 8;
    const int64_t r = r0 + rr, c = c0 + cc;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows && c < cols) v = *reinterpret_cast<const uint4*>(x + r * cols + c);
    *reinterpret_cast<uint4*>(&tile[rr][cc]) = v;
    if constexpr (kSquare) {
      const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(p[k]);
        m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
  const float fmax = e5m2 ? 57344.0f : 448.0f;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  float square_scale = 1.0f;
  if constexpr (kSquare) {
    __shared__ float warp_amax[8];
    m = warp_max(m);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();  // (also: the tile is whole)
    m = 0.0f;
    for (int w = 0; w < 8; ++w) m = fmaxf(m, warp_amax[w]);
    square_scale = block_scale(m, fmax);
    if (t == 0) {
      if (scale_inv) scale_inv[blockIdx.y * pad4(blocks(cols)) + blockIdx.x] = __fdiv_rn(1.0f, square_scale);
      if (t_scale_inv) t_scale_inv[blockIdx.x * pad4(blocks(rows)) + blockIdx.y] = __fdiv_rn(1.0f, square_scale);
    }
  } else {
    __syncthreads();
  }
  const int64_t c_lane = c0 + lane * 4, r_lane = r0 + lane * 4;
  if (out) {  // rows: warp w takes the tile's rows 16w .. 16w + 15, lane l its columns 4l .. 4l + 3
    for (int j = 0; j < 16; ++j) {
      const int rr = warp * 16 + j;
      const int64_t r = r0 + rr;
      float v[4];
      for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(tile[rr][lane * 4 + k]);
      float scale = square_scale;
      if constexpr (!kSquare) scale = warp_block_scale(v, fmax, r < rows ? scale_inv + (c0 / kB) * pad4(rows) + r : nullptr);
      if (r < rows && c_lane < cols) *reinterpret_cast<uint32_t*>(out + r * cols + c_lane) = quantize4(v, scale, kind);
    }
  }
  if (out_t) {  // columns: warp w takes the tile's columns 16w .. 16w + 15, lane l its rows 4l .. 4l + 3
    for (int j = 0; j < 16; ++j) {
      const int cc = warp * 16 + j;
      const int64_t c = c0 + cc;
      float v[4];
      for (int k = 0; k < 4; ++k) v[k] = __bfloat162float(tile[lane * 4 + k][cc]);
      float scale = square_scale;
      if constexpr (!kSquare) scale = warp_block_scale(v, fmax, c < cols ? t_scale_inv + (r0 / kB) * pad4(cols) + c : nullptr);
      if (c < cols && r_lane < rows) *reinterpret_cast<uint32_t*>(out_t + c * rows + r_lane) = quantize4(v, scale, kind);
    }
  }
}

void launch(bool square, const bf16* x, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* scale_inv, uint8_t* out_t,
            float* t_scale_inv, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || (!out && !out_t)) return;
  const auto aligned = [](const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; };
  if (cols % 8 != 0 || rows % 4 != 0 || !aligned(x, 16) || !aligned(out, 4) || !aligned(out_t, 4) || blocks(rows) > 65535) {
    throw std::logic_error("FP8 blockwise quantisation of a " + std::to_string(rows) + " x " + std::to_string(cols) +
                           " tensor: the rows must be a multiple of 4 and the columns of 8, the input 16-byte aligned");
  }
  if ((out && !scale_inv) || (out_t && !t_scale_inv)) throw std::logic_error("FP8 blockwise quantisation: an output without its scales");
  const dim3 grid(static_cast<unsigned>(blocks(cols)), static_cast<unsigned>(blocks(rows)));
  const bool e5m2 = type == Fp8Type::kE5M2;
  if (square) quantize_tile_kernel<true><<<grid, 256, 0, stream>>>(x, rows, cols, e5m2, out, scale_inv, out_t, t_scale_inv);
  else quantize_tile_kernel<false><<<grid, 256, 0, stream>>>(x, rows, cols, e5m2, out, scale_inv, out_t, t_scale_inv);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t fp8_vec128_scales(int64_t R, int64_t K) { return blocks(K) * pad4(R); }
int64_t fp8_blk128_scales(int64_t R, int64_t K) { return blocks(R) * pad4(blocks(K)); }

void fp8_quantize_1x128(const bf16* x, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* out_scale_inv, uint8_t* out_t,
                        float* out_t_scale_inv, cudaStream_t stream) {
  launch(false, x, rows, cols, type, out, out_scale_inv, out_t, out_t_scale_inv, stream);
}

void fp8_quantize_128x128(const bf16* w, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* scale_inv, uint8_t* out_t,
                          float* t_scale_inv, cudaStream_t stream) {
  launch(true, w, rows, cols, type, out, scale_inv, out_t, t_scale_inv, stream);
}

}  // namespace mt::cuda
