// cross_entropy_bf16.cu: one block per row, 16-byte loads (8 bf16) when the row allows it.
#include <cfloat>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/cross_entropy_bf16.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void online_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * __expf(m - x) + 1.0f;
    m = x;
  } else {
    s += __expf(x - m);
  }
}

__global__ void ce_kernel(float* losses, bf16* logits, const int32_t* targets, const float* mask, float grad_scale, int64_t V, bool write_grad,
                          bool vec) {
  const int64_t row = blockIdx.x;
  bf16* x = logits + row * V;
  float m = -FLT_MAX, s = 0.0f;
  if (vec) {
    const int64_t nv = V / 8;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
      uint4 u = xv[i];
      const bf16* e = reinterpret_cast<const bf16*>(&u);
#pragma unroll
      for (int k = 0; k < 8; ++k) online_add(m, s, __bfloat162float(e[k]));
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) online_add(m, s, __bfloat162float(x[i]));
  }
  // Combine (m, s) across the block: the max first, then the rescaled sums.
  __shared__ float red[kThreads / 32];
  float wm = m;
  for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = wm;
  __syncthreads();
  float bm = -FLT_MAX;
  for (int w = 0; w < kThreads / 32; ++w) bm = fmaxf(bm, red[w]);
  const float ssum = block_sum(s > 0.0f ? s * __expf(m - bm) : 0.0f);
  const float lse = bm + __logf(ssum);
  const int32_t tgt = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - __bfloat162float(x[tgt]);
  if (!write_grad) return;
  __syncthreads();  // x[tgt] read before it is overwritten
  const float scale = grad_scale * (mask ? mask[row] : 1.0f);
  if (vec) {
    const int64_t nv = V / 8;
    uint4* xv = reinterpret_cast<uint4*>(x);
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
      uint4 u = xv[i];
      bf16* e = reinterpret_cast<bf16*>(&u);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t col = i * 8 + k;
        const float p = __expf(__bfloat162float(e[k]) - lse);
        e[k] = __float2bfloat16((p - (col == tgt ? 1.0f : 0.0f)) * scale);
      }
      xv[i] = u;
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float p = __expf(__bfloat162float(x[i]) - lse);
      x[i] = __float2bfloat16((p - (i == tgt ? 1.0f : 0.0f)) * scale);
    }
  }
}

__global__ void masked_sum_kernel(float* acc, const float* losses, const float* mask, int64_t N, float weight) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += losses[i] * (mask ? mask[i] : 1.0f);
  s = block_sum(s);
  if (threadIdx.x == 0) acc[0] += weight * s;
}

}  // namespace

void cross_entropy_fused_bf16(float* losses, bf16* logits, const int32_t* targets, const float* loss_mask, float grad_scale, int64_t N,
                              int64_t V, bool write_grad, cudaStream_t stream) {
  if (N == 0) return;
  const bool vec = V % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) % 16) == 0;
  ce_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, logits, targets, loss_mask, grad_scale, V, write_grad, vec);
  MT_CUDA_CHECK_LAUNCH();
}

void masked_loss_sum(float* acc, const float* losses, const float* mask, int64_t N, float weight, cudaStream_t stream) {
  masked_sum_kernel<<<1, 1024, 0, stream>>>(acc, losses, mask, N, weight);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
