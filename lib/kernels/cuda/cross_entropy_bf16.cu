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

// This block's (max, sum of exp(x - max)) over one row of V bf16 values, combined across the block.
template <typename T16>
__device__ void row_stats(const T16* x, int64_t V, bool vec, float& max_out, float& sum_out) {
  float m = -FLT_MAX, s = 0.0f;
  if (vec) {
    const int64_t nv = V / 8;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
      uint4 u = xv[i];
      const T16* e = reinterpret_cast<const T16*>(&u);
#pragma unroll
      for (int k = 0; k < 8; ++k) online_add(m, s, to_f(e[k]));
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) online_add(m, s, to_f(x[i]));
  }
  // Combine (m, s) across the block: the max first, then the rescaled sums.
  __shared__ float red[kThreads / 32];
  float wm = m;
  for (int o = 16; o > 0; o >>= 1) wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = wm;
  __syncthreads();
  float bm = -FLT_MAX;
  for (int w = 0; w < kThreads / 32; ++w) bm = fmaxf(bm, red[w]);
  max_out = bm;
  sum_out = block_sum(s > 0.0f ? s * __expf(m - bm) : 0.0f);
}

// x[i] = (exp(x[i] - lse) - [i == tgt]) * scale over one row (tgt is a column of this row, or outside it).
template <typename T16>
__device__ void write_row_grad(T16* x, int64_t V, bool vec, float lse, int64_t tgt, float scale) {
  if (vec) {
    const int64_t nv = V / 8;
    uint4* xv = reinterpret_cast<uint4*>(x);
    for (int64_t i = threadIdx.x; i < nv; i += kThreads) {
      uint4 u = xv[i];
      T16* e = reinterpret_cast<T16*>(&u);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t col = i * 8 + k;
        const float p = __expf(to_f(e[k]) - lse);
        e[k] = from_f<T16>((p - (col == tgt ? 1.0f : 0.0f)) * scale);
      }
      xv[i] = u;
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float p = __expf(to_f(x[i]) - lse);
      x[i] = from_f<T16>((p - (i == tgt ? 1.0f : 0.0f)) * scale);
    }
  }
}

template <typename T16>
__global__ void ce_kernel(float* losses, T16* logits, const int32_t* targets, const float* mask, float grad_scale, const float* loss_scale,
                          int64_t V, bool write_grad, bool vec) {
  const int64_t row = blockIdx.x;
  T16* x = logits + row * V;
  float bm, ssum;
  row_stats(x, V, vec, bm, ssum);
  const float lse = bm + __logf(ssum);
  const int32_t tgt = targets[row];
  if (threadIdx.x == 0) losses[row] = lse - to_f(x[tgt]);
  if (!write_grad) return;
  __syncthreads();  // x[tgt] read before it is overwritten
  write_row_grad(x, V, vec, lse, tgt, grad_scale * (loss_scale ? *loss_scale : 1.0f) * (mask ? mask[row] : 1.0f));
}

template <typename T16>
__global__ void ce_shard_stats_kernel(float* stats, const T16* logits, const int32_t* targets, int64_t N, int64_t V, int64_t v0, bool vec) {
  const int64_t row = blockIdx.x;
  const T16* x = logits + row * V;
  float bm, ssum;
  row_stats(x, V, vec, bm, ssum);
  if (threadIdx.x == 0) {
    const int64_t tgt = static_cast<int64_t>(targets[row]) - v0;
    stats[row] = bm;
    stats[N + row] = bm;
    stats[2 * N + row] = ssum;
    stats[3 * N + row] = tgt >= 0 && tgt < V ? to_f(x[tgt]) : 0.0f;
  }
}

__global__ void ce_shard_rescale_kernel(float* stats, int64_t N) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < N; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    stats[2 * N + i] *= __expf(stats[N + i] - stats[i]);
  }
}

template <typename T16>
__global__ void ce_shard_finish_kernel(float* losses, T16* logits, const float* stats, const int32_t* targets, const float* mask, float grad_scale,
                                       const float* loss_scale, int64_t N, int64_t V, int64_t v0, bool write_grad, bool vec) {
  const int64_t row = blockIdx.x;
  const float lse = stats[row] + __logf(stats[2 * N + row]);
  if (threadIdx.x == 0) losses[row] = lse - stats[3 * N + row];
  if (!write_grad) return;
  write_row_grad(logits + row * V, V, vec, lse, static_cast<int64_t>(targets[row]) - v0,
                 grad_scale * (loss_scale ? *loss_scale : 1.0f) * (mask ? mask[row] : 1.0f));
}

__global__ void masked_sum_kernel(float* acc, const float* losses, const float* mask, int64_t N, float weight) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) s += losses[i] * (mask ? mask[i] : 1.0f);
  s = block_sum(s);
  if (threadIdx.x == 0) acc[0] += weight * s;
}

}  // namespace

template <typename T16>
void cross_entropy_fused_bf16_t(float* losses, T16* logits, const int32_t* targets, const float* loss_mask, float grad_scale,
                                const float* loss_scale, int64_t N, int64_t V, bool write_grad, cudaStream_t stream) {
  if (N == 0) return;
  const bool vec = V % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) % 16) == 0;
  ce_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, logits, targets, loss_mask, grad_scale, loss_scale, V, write_grad, vec);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T16>
void ce_shard_stats_t(float* stats, const T16* logits, const int32_t* targets, int64_t N, int64_t V_local, int64_t v0, cudaStream_t stream) {
  if (N == 0) return;
  const bool vec = V_local % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) % 16) == 0;
  ce_shard_stats_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(stats, logits, targets, N, V_local, v0, vec);
  MT_CUDA_CHECK_LAUNCH();
}

void ce_shard_rescale(float* stats, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  ce_shard_rescale_kernel<<<grid_for(N, 256), 256, 0, stream>>>(stats, N);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T16>
void ce_shard_finish_t(float* losses, T16* logits, const float* stats, const int32_t* targets, const float* loss_mask, float grad_scale,
                       const float* loss_scale, int64_t N, int64_t V_local, int64_t v0, bool write_grad, cudaStream_t stream) {
  if (N == 0) return;
  const bool vec = V_local % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) % 16) == 0;
  ce_shard_finish_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(losses, logits, stats, targets, loss_mask, grad_scale, loss_scale, N, V_local,
                                                                            v0, write_grad, vec);
  MT_CUDA_CHECK_LAUNCH();
}

void masked_loss_sum(float* acc, const float* losses, const float* mask, int64_t N, float weight, cudaStream_t stream) {
  masked_sum_kernel<<<1, 1024, 0, stream>>>(acc, losses, mask, N, weight);
  MT_CUDA_CHECK_LAUNCH();
}

void cross_entropy_fused_bf16(float* losses, bf16* logits, const int32_t* targets, const float* loss_mask, float grad_scale, int64_t N,
                              int64_t V, bool write_grad, cudaStream_t stream, F16 t, const float* loss_scale) {
  if (t == F16::kFP16) cross_entropy_fused_bf16_t(losses, hp(logits), targets, loss_mask, grad_scale, loss_scale, N, V, write_grad, stream);
  else cross_entropy_fused_bf16_t(losses, logits, targets, loss_mask, grad_scale, loss_scale, N, V, write_grad, stream);
}
void ce_shard_stats(float* stats, const bf16* logits, const int32_t* targets, int64_t N, int64_t V_local, int64_t v0, cudaStream_t stream,
                    F16 t) {
  if (t == F16::kFP16) ce_shard_stats_t(stats, hp(logits), targets, N, V_local, v0, stream);
  else ce_shard_stats_t(stats, logits, targets, N, V_local, v0, stream);
}
void ce_shard_finish(const CeShardFinish& a, cudaStream_t stream) {
  if (a.type == F16::kFP16) {
    ce_shard_finish_t(a.losses, hp(a.logits), a.stats, a.targets, a.loss_mask, a.grad_scale, a.loss_scale, a.rows, a.vocab_local, a.vocab_start,
                      a.write_grad, stream);
  } else {
    ce_shard_finish_t(a.losses, a.logits, a.stats, a.targets, a.loss_mask, a.grad_scale, a.loss_scale, a.rows, a.vocab_local, a.vocab_start,
                      a.write_grad, stream);
  }
}

}  // namespace mt::cuda
