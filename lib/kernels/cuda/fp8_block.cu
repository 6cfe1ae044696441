// fp8_block.cu: blockwise FP8 quantisation in 128 x 128 tiles of the input, read once (one 16-byte load per 8 values).
// The 1 x 128 blocks along rows are quantised from registers as they are loaded: the 16 threads that load a row take
// its amax by a half-warp reduction, and each writes its 8 bytes. The blocks of 128 rows of one column go through
// shared memory: the tile is kept with an odd pitch in 4-byte words, so the 32 lanes reading rows l, l + 32, l + 64
// and l + 96 of one column pair touch 32 different banks, and the column's bytes are written straight into the
// transposed output. A 128 x 128 block takes the tile's amax by a block reduction first and writes both layouts.
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

// The tile's row pitch: 130 bf16 = 65 four-byte words (odd: a column's rows fall in different banks).
constexpr int kB = static_cast<int>(kFp8BlockSize), kPitchWords = kB / 2 + 1;
constexpr int kThreads = 256, kLoads = kB * kB / 8 / kThreads;  // eight 16-byte loads per thread

__host__ __device__ int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }
__host__ __device__ int64_t blocks(int64_t n) { return (n + kB - 1) / kB; }

// The power-of-2 scale of a block (kernels/cpu/fp8's fp8_block_scale): the amax's scale rounded down to 2^k.
__device__ __forceinline__ float block_scale(float amax, float max) {
  return __uint_as_float(__float_as_uint(fp8_scale_from_amax(amax, max)) & 0xFF800000u);
}

// The max over the lanes whose ids differ only in the bits below `width` (width a power of 2, at most 32).
__device__ __forceinline__ float lanes_max(float m, int width) {
  for (int o = width / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Eight bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(p[k]);
    v[2 * k] = f.x;
    v[2 * k + 1] = f.y;
  }
}

// kSquare: one 128 x 128 block per tile (scale_inv blk128 of (rows, cols), t_scale_inv blk128 of (cols, rows)); else
// 1 x 128 blocks along rows (out, scale_inv: vec128 of (rows, cols)) and 128 x 1 blocks along columns (out_t,
// t_scale_inv: vec128 of (cols, rows)).
template <bool kSquare>
__global__ void __launch_bounds__(kThreads) quantize_tile_kernel(const bf16* __restrict__ x, int64_t rows, int64_t cols, bool e5m2,
                                                                 uint8_t* __restrict__ out, float* __restrict__ scale_inv,
                                                                 uint8_t* __restrict__ out_t, float* __restrict__ t_scale_inv) {
  __shared__ uint32_t tile[kB * kPitchWords];  // bf16 pairs: row rr's columns 2j, 2j + 1 at word rr * kPitchWords + j
  __shared__ float warp_amax[kThreads / 32];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kB, c0 = static_cast<int64_t>(blockIdx.x) * kB;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const float fmax = e5m2 ? 57344.0f : 448.0f;
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  // Load: thread t's i-th run of 8 is row (t + 256 i) / 16 of the tile, columns 8 ((t + 256 i) % 16) onwards; past the
  // tensor's edges, zeros (they change no amax and are never written).
  uint4 raw[kLoads];
  float m = 0.0f;
  for (int i = 0; i < kLoads; ++i) {
    const int id = t + kThreads * i, rr = id >> 4, cc = (id & 15) * 8;
    const int64_t r = r0 + rr, c = c0 + cc;
    raw[i] = make_uint4(0, 0, 0, 0);
    if (r < rows && c < cols) raw[i] = *reinterpret_cast<const uint4*>(x + r * cols + c);
    uint32_t* dst = tile + rr * kPitchWords + cc / 2;
    dst[0] = raw[i].x;
    dst[1] = raw[i].y;
    dst[2] = raw[i].z;
    dst[3] = raw[i].w;
    if constexpr (kSquare) {
      float v[8];
      unpack8(raw[i], v);
      for (float f : v) m = fmaxf(m, fabsf(f));
    }
  }
  float square_scale = 1.0f;
  if constexpr (kSquare) {
    m = lanes_max(m, 32);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    m = 0.0f;
    for (float w : warp_amax) m = fmaxf(m, w);
    square_scale = block_scale(m, fmax);
    if (t == 0) {
      if (scale_inv) scale_inv[blockIdx.y * pad4(blocks(cols)) + blockIdx.x] = __fdiv_rn(1.0f, square_scale);
      if (t_scale_inv) t_scale_inv[blockIdx.x * pad4(blocks(rows)) + blockIdx.y] = __fdiv_rn(1.0f, square_scale);
    }
  }
  if (out) {  // rows, from the registers: the 16 threads of a row (a half warp) hold its 128 values
    for (int i = 0; i < kLoads; ++i) {
      const int id = t + kThreads * i, rr = id >> 4, cc = (id & 15) * 8;
      const int64_t r = r0 + rr, c = c0 + cc;
      float v[8];
      unpack8(raw[i], v);
      float scale = square_scale;
      if constexpr (!kSquare) {
        float a = 0.0f;
        for (float f : v) a = fmaxf(a, fabsf(f));
        scale = block_scale(lanes_max(a, 16), fmax);
        if ((id & 15) == 0 && r < rows) scale_inv[(c0 / kB) * pad4(rows) + r] = __fdiv_rn(1.0f, scale);
      }
      if (r < rows && c < cols) {
        uint2 q = make_uint2(0, 0);
        for (int k = 0; k < 4; ++k) {
          q.x |= static_cast<uint32_t>(to_fp8(v[k], scale, kind)) << (8 * k);
          q.y |= static_cast<uint32_t>(to_fp8(v[4 + k], scale, kind)) << (8 * k);
        }
        *reinterpret_cast<uint2*>(out + r * cols + c) = q;
      }
    }
  }
  if (out_t) {  // columns, from the tile: warp w takes its column pairs 8w .. 8w + 7; lane l the rows l + 32 k
    __syncthreads();
    for (int j = 0; j < 8; ++j) {
      const int pair = warp * 8 + j;
      float lo[4], hi[4];
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = tile[(lane + 32 * k) * kPitchWords + pair];
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
        lo[k] = f.x;
        hi[k] = f.y;
      }
      for (int half = 0; half < 2; ++half) {
        const float(&v)[4] = half == 0 ? lo : hi;
        const int64_t c = c0 + 2 * pair + half;
        float scale = square_scale;
        if constexpr (!kSquare) {
          scale = block_scale(lanes_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))), 32), fmax);
          if (lane == 0 && c < cols) t_scale_inv[(r0 / kB) * pad4(cols) + c] = __fdiv_rn(1.0f, scale);
        }
        if (c < cols) {
          for (int k = 0; k < 4; ++k) {
            const int64_t r = r0 + lane + 32 * k;
            if (r < rows) out_t[c * rows + r] = to_fp8(v[k], scale, kind);
          }
        }
      }
    }
  }
}

void launch(bool square, const bf16* x, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* scale_inv, uint8_t* out_t,
            float* t_scale_inv, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || (!out && !out_t)) return;
  const auto aligned = [](const void* p, std::uintptr_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; };
  if (cols % 8 != 0 || rows % 4 != 0 || !aligned(x, 16) || !aligned(out, 8) || blocks(rows) > 65535) {
    throw std::logic_error("FP8 blockwise quantisation of a " + std::to_string(rows) + " x " + std::to_string(cols) +
                           " tensor: the rows must be a multiple of 4 and the columns of 8, the input 16-byte aligned, the output 8-byte aligned");
  }
  if ((out && !scale_inv) || (out_t && !t_scale_inv)) throw std::logic_error("FP8 blockwise quantisation: an output without its scales");
  const dim3 grid(static_cast<unsigned>(blocks(cols)), static_cast<unsigned>(blocks(rows)));
  const bool e5m2 = type == Fp8Type::kE5M2;
  if (square) quantize_tile_kernel<true><<<grid, kThreads, 0, stream>>>(x, rows, cols, e5m2, out, scale_inv, out_t, t_scale_inv);
  else quantize_tile_kernel<false><<<grid, kThreads, 0, stream>>>(x, rows, cols, e5m2, out, scale_inv, out_t, t_scale_inv);
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
