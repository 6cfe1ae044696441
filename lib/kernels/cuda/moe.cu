// moe.cu (CUDA): see moe.h.
#include <cuda_bf16.h>

#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cpu/router.h"  // kSinkhornMaxIterations
#include "model/moe_input_jitter.h"
#include "model/moe_random_logits.h"
#include "model/moe_scores.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kMaxExperts = 256;

__device__ __forceinline__ float sigm(float x) { return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x)))); }

// An element-wise score (r.sigmoid): sigmoid, or sqrtsoftplus's sqrt(softplus(x)) (model/moe_scores.h, the CPU
// router's too), and its derivative given the score s.
__device__ __forceinline__ float elementwise_score(const MoeRouting& r, float x) { return moe_elementwise_score(r.sqrtsoftplus, x); }
__device__ __forceinline__ double elementwise_slope(const MoeRouting& r, float x, double s) { return moe_elementwise_slope(r.sqrtsoftplus, x, s); }

// The top k of v[0..E) (descending, ties to the lower index) into idx.
__device__ void top_k(const float* v, int E, int k, int32_t* idx) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (taken) continue;
      if (best < 0 || v[e] > v[best]) best = e;
    }
    idx[j] = best;
  }
}

// Megatron's group_limited_topk (as kernels/cpu/router.cpp): each of the groups of E / groups experts scored by the sum
// of its best k / group_topk scores, the best group_topk groups kept, the top k over their experts.
__device__ void limited_top_k(const float* v, int E, int k, int groups, int group_topk, int32_t* idx) {
  if (groups <= 0 || group_topk <= 0) {
    top_k(v, E, k, idx);
    return;
  }
  const int per = E / groups, best = k / group_topk;
  float group_score[kMaxExperts];
  int32_t tmp[kMaxExperts];
  for (int g = 0; g < groups; ++g) {
    top_k(v + g * per, per, best, tmp);
    double sum = 0;
    for (int i = 0; i < best; ++i) sum += v[g * per + tmp[i]];
    group_score[g] = static_cast<float>(sum);
  }
  int32_t kept[kMaxExperts];
  top_k(group_score, groups, group_topk, kept);
  float masked[kMaxExperts];
  for (int e = 0; e < E; ++e) masked[e] = -INFINITY;
  for (int i = 0; i < group_topk; ++i) {
    for (int e = kept[i] * per; e < (kept[i] + 1) * per; ++e) masked[e] = v[e];
  }
  top_k(masked, E, k, idx);
}

// The router's logits, a warp per (token, expert), accumulated in Accumulator (float, or double for
// --moe-router-dtype fp64, where the bias joins the sum before the one rounding to fp32).
template <typename Accumulator, typename T16>
__global__ void logits_kernel(float* logits, const T16* xn, const T16* w, const T16* b, int64_t T, int64_t E, int64_t h) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= T * E) return;
  const int64_t t = warp / E, e = warp % E;
  Accumulator s = 0;
  for (int64_t i = lane; i < h; i += 32) s += static_cast<Accumulator>(to_f(xn[t * h + i])) * to_f(w[e * h + i]);
  for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
  if (lane == 0) logits[t * E + e] = static_cast<float>(b ? s + static_cast<Accumulator>(to_f(b[e])) : s);
}

__global__ void route_kernel(int32_t* top, float* weight, const float* logits, MoeRouting r, const float* expert_bias, const float* choice_scores) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= r.tokens) return;
  const int E = static_cast<int>(r.experts), k = static_cast<int>(r.topk);
  const float* x = logits + t * E;
  float scores[kMaxExperts];
  if (r.sigmoid) {
    for (int e = 0; e < E; ++e) scores[e] = elementwise_score(r, x[e]);
  } else if (r.pre_softmax) {
    float mx = x[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, x[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(x[e] - mx));
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(exp(static_cast<double>(x[e] - mx)) / sum);
  } else {
    for (int e = 0; e < E; ++e) scores[e] = x[e];
  }
  int32_t* idx = top + t * k;
  if (choice_scores) {  // (sinkhorn routing: the normalised logits choose)
    top_k(choice_scores + t * E, E, k, idx);
  } else if (expert_bias) {  // the choice from the biased scores, the weights from the scores
    float choice[kMaxExperts];
    for (int e = 0; e < E; ++e) choice[e] = scores[e] + expert_bias[e];
    limited_top_k(choice, E, k, static_cast<int>(r.num_groups), static_cast<int>(r.group_topk), idx);
  } else {
    limited_top_k(scores, E, k, static_cast<int>(r.num_groups), static_cast<int>(r.group_topk), idx);
  }
  float* w = weight + t * k;
  if (r.sigmoid) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += scores[idx[j]];
    for (int j = 0; j < k; ++j) w[j] = k > 1 ? static_cast<float>(scores[idx[j]] / (sum + 1e-20)) : scores[idx[j]];
  } else if (r.pre_softmax) {
    for (int j = 0; j < k; ++j) w[j] = scores[idx[j]];
  } else {
    float mx = scores[idx[0]];
    for (int j = 1; j < k; ++j) mx = fmaxf(mx, scores[idx[j]]);
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += exp(static_cast<double>(scores[idx[j]] - mx));
    for (int j = 0; j < k; ++j) w[j] = static_cast<float>(exp(static_cast<double>(scores[idx[j]] - mx)) / sum);
  }
  for (int j = 0; j < k; ++j) w[j] *= r.scaling;
}

// Megatron's sinkhorn in one block of kSinkhornThreads: cost = exp(logits) expert-major in scratch ([E, T], so that both
// phases read consecutive tokens), then rounds of d0[t] (a thread per token, its E products summed in order) and d1[e]
// (a warp per expert, its lanes' strided sums combined by shuffles), the mean change of d1 deciding in thread 0 whether
// to go on, as kernels/cpu/router.cpp's sinkhorn_normalize; out[T, E] = d1 cost d0.
constexpr int kSinkhornThreads = 1024;
__global__ void __launch_bounds__(kSinkhornThreads) sinkhorn_kernel(float* out, float* cost, const float* logits, int64_t T, int E) {
  __shared__ float d1[kMaxExperts], d1_old[kMaxExperts];
  __shared__ int go_on;
  float* d0 = cost + T * E;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  for (int64_t i = tid; i < T * E; i += kSinkhornThreads) cost[(i % E) * T + i / E] = expf(logits[i]);
  for (int e = tid; e < E; e += kSinkhornThreads) d1[e] = d1_old[e] = 1.0f;
  __syncthreads();
  const float eps = 1e-8f, tol = 1e-4f;
  for (int round = 0; round < cpu::kSinkhornMaxIterations; ++round) {
    for (int64_t t = tid; t < T; t += kSinkhornThreads) {
      float sum = 0;
      for (int e = 0; e < E; ++e) sum += d1[e] * cost[e * T + t];
      d0[t] = (1.0f / static_cast<float>(T)) * 1.0f / (sum + eps);
    }
    __syncthreads();
    for (int e = warp; e < E; e += kSinkhornThreads / 32) {
      float sum = 0;
      for (int64_t t = lane; t < T; t += 32) sum += d0[t] * cost[e * T + t];
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      if (lane == 0) d1[e] = (1.0f / static_cast<float>(E)) * 1.0f / (sum + eps);
    }
    __syncthreads();
    if (tid == 0) {
      float error = 0;
      for (int e = 0; e < E; ++e) {
        error += fabsf(d1_old[e] - d1[e]);
        d1_old[e] = d1[e];
      }
      go_on = error / static_cast<float>(E) > tol;
    }
    __syncthreads();
    if (!go_on) break;
  }
  for (int64_t i = tid; i < T * E; i += kSinkhornThreads) out[i] = d1[i % E] * cost[(i % E) * T + i / E] * d0[i / E];
}

// The permutation in three deterministic passes over chunks of kPermuteChunk choices: each chunk's count per expert
// (parts[chunk, e]); then, in one block, the totals, the experts' offsets and each chunk's first row per expert (in
// place of its count); then each chunk places its choices, each expert's in token order (warp ballots of equal experts,
// then the warps before it).
constexpr int kPermuteChunk = 256, kPermuteWarps = kPermuteChunk / 32;
__global__ void permute_count_kernel(int32_t* parts, const int32_t* top, int64_t n, int64_t E) {
  __shared__ int32_t count[kMaxExperts];
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kPermuteChunk) + threadIdx.x;
  if (i < n) atomicAdd(&count[top[i]], 1);  // integer counts: the order does not matter
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) parts[blockIdx.x * E + e] = count[e];
}

__global__ void permute_scan_kernel(int32_t* parts, int32_t* counts, int32_t* offsets, int64_t chunks, int64_t E, int32_t align) {
  __shared__ int32_t start[kMaxExperts + 1];
  const int64_t e = threadIdx.x;
  int32_t total = 0;
  if (e < E) {
    for (int64_t c = 0; c < chunks; ++c) total += parts[c * E + e];
    counts[e] = total;
    start[e] = total;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t off = 0;
    for (int64_t x = 0; x < E; ++x) {
      const int32_t n = start[x];
      start[x] = off;
      offsets[x] = off;
      off += (n + align - 1) / align * align;
    }
    offsets[E] = off;
  }
  __syncthreads();
  if (e < E) {
    int32_t at = start[e];
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t n = parts[c * E + e];
      parts[c * E + e] = at;
      at += n;
    }
  }
}

__global__ void permute_place_kernel(int32_t* row, const int32_t* parts, const int32_t* top, int64_t n, int64_t E) {
  __shared__ int32_t warp_count[kPermuteWarps][kMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t x = threadIdx.x; x < kPermuteWarps * E; x += blockDim.x) warp_count[x / E][x % E] = 0;
  __syncthreads();
  const int64_t i = blockIdx.x * static_cast<int64_t>(kPermuteChunk) + threadIdx.x;
  const int32_t e = i < n ? top[i] : -1;
  const unsigned same = __match_any_sync(0xffffffffu, e);
  if (e >= 0 && lane == __ffs(same) - 1) warp_count[warp][e] = __popc(same);
  __syncthreads();
  if (e < 0) return;
  int32_t rank = __popc(same & ((1u << lane) - 1u));
  for (int w = 0; w < warp; ++w) rank += warp_count[w][e];
  row[i] = parts[blockIdx.x * E + e] + rank;
}

// The row copies and sums, eight columns a thread where the hidden size allows it (W = 8: h % 8 == 0 and the buffers
// 16-byte aligned), else one.
template <int W>
struct Cols {
  float x[W];
};
template <int W, typename T16>
__device__ __forceinline__ Cols<W> load_cols(const T16* p) {
  Cols<W> v;
  if constexpr (W == 8) {
    const Bf16x8 b = load_bf16x8(p);
#pragma unroll
    for (int q = 0; q < 8; ++q) v.x[q] = b.x[q];
  } else {
    v.x[0] = to_f(*p);
  }
  return v;
}
template <int W, typename T16>
__device__ __forceinline__ void store_cols(T16* p, const Cols<W>& v) {
  if constexpr (W == 8) {
    Bf16x8 b;
#pragma unroll
    for (int q = 0; q < 8; ++q) b.x[q] = v.x[q];
    store_bf16x8(p, b);
  } else {
    *p = from_f<T16>(v.x[0]);
  }
}

// One token per block: its row copied to each of its k slots' rows (times the slot's weight where row_weight is given).
template <int W, typename T16>
__global__ void gather_kernel(T16* rows, const T16* xn, const int32_t* row, const float* row_weight, int64_t T, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  if (t >= T) return;
  for (int64_t c = threadIdx.x * W; c < h; c += blockDim.x * W) {
    const Cols<W> v = load_cols<W>(xn + t * h + c);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;  // (-1: dropped by the capacity)
      if (row_weight) {
        const float wj = row_weight[t * k + j];
        Cols<W> s;
#pragma unroll
        for (int q = 0; q < W; ++q) s.x[q] = wj * v.x[q];
        store_cols<W>(rows + r * h + c, s);
      } else {
        store_cols<W>(rows + r * h + c, v);
      }
    }
  }
}

template <int W, typename T16>
__global__ void pad_rows_kernel(T16* rows, const T16* xn, const int32_t* map, int64_t n, int64_t h) {
  const int64_t i = blockIdx.x;
  if (i >= n) return;
  const int64_t r = map[2 * i], t = map[2 * i + 1];
  for (int64_t c = threadIdx.x * W; c < h; c += blockDim.x * W) store_cols<W>(rows + r * h + c, xn ? load_cols<W>(xn + t * h + c) : Cols<W>{});
}

template <int W, typename T16>
__global__ void combine_kernel(T16* out, const T16* y, const int32_t* row, const float* weight, int64_t T, int64_t k, int64_t h) {
  const int64_t t = blockIdx.x;
  if (t >= T) return;
  for (int64_t c = threadIdx.x * W; c < h; c += blockDim.x * W) {
    Cols<W> s{};
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;  // dropped: its weight counts as 0
      const float wj = weight[t * k + j];
      const Cols<W> v = load_cols<W>(y + r * h + c);
#pragma unroll
      for (int q = 0; q < W; ++q) s.x[q] += wj * v.x[q];
    }
    store_cols<W>(out + t * h + c, s);
  }
}

template <int W, typename T16>
__global__ void combine_backward_kernel(T16* dy_rows, float* dweight, const T16* dout, const T16* y, const int32_t* row,
                                        const float* weight, int64_t n, int64_t k, int64_t h) {
  const int64_t i = blockIdx.x;  // one (token, slot)
  if (i >= n) return;
  const int64_t t = i / k, r = row[i];
  if (r < 0) {  // dropped: no row, and no gradient for its weight
    if (threadIdx.x == 0) dweight[i] = 0.0f;
    return;
  }
  const float w = weight[i];
  float s = 0.0f;
  for (int64_t c = threadIdx.x * W; c < h; c += blockDim.x * W) {
    const Cols<W> d = load_cols<W>(dout + t * h + c), v = load_cols<W>(y + r * h + c);
    Cols<W> o;
#pragma unroll
    for (int q = 0; q < W; ++q) {
      o.x[q] = w * d.x[q];
      s += v.x[q] * d.x[q];
    }
    store_cols<W>(dy_rows + r * h + c, o);
  }
  s = block_sum(s);
  if (threadIdx.x == 0) dweight[i] = s;
}

__global__ void aux_scores_kernel(float* scores, float* counts_aux, float* lse2, const float* logits, MoeRouting r) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= r.tokens) return;
  const int E = static_cast<int>(r.experts);
  const float* x = logits + t * E;
  float* s = scores + t * E;
  float mx = x[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, x[e]);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(x[e] - mx));
  const double lse = mx + log(sum);
  lse2[t] = static_cast<float>(lse * lse);
  if (r.sigmoid) {
    double tot = 1e-20;
    for (int e = 0; e < E; ++e) tot += (s[e] = elementwise_score(r, x[e]));
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(s[e] / tot);
  } else {
    for (int e = 0; e < E; ++e) s[e] = static_cast<float>(exp(static_cast<double>(x[e] - mx)) / sum);
  }
  int32_t idx[kMaxExperts];
  top_k(s, E, static_cast<int>(r.topk), idx);
  float* counts = counts_aux + (t / r.balance_len()) * E;  // (whole numbers, exact in fp32 below 2^24)
  for (int j = 0; j < r.topk; ++j) atomicAdd(&counts[idx[j]], 1.0f);
}

// Block g E + e (< G E) sums expert e's scores over group g's n tokens; block G E sums lse^2 over all T: fixed orders.
__global__ void column_sums_kernel(float* probsum, float* z, const float* scores, const float* lse2, int64_t T, int64_t E, int64_t G, int64_t n) {
  const int64_t i = blockIdx.x, g = i / E, e = i % E;
  float s = 0.0f;
  if (i < G * E) {
    for (int64_t t = g * n + threadIdx.x; t < (g + 1) * n; t += blockDim.x) s += scores[t * E + e];
  } else {
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) s += lse2[t];
  }
  s = block_sum(s);
  if (threadIdx.x == 0) {
    if (i < G * E) probsum[i] = s;
    else z[0] = s;
  }
}

// One block per layer, one thread per expert: sign(mean - count) as sign(sum - E count), exact on the whole counts.
__global__ void update_expert_bias_kernel(float* bias, const float* acc, int64_t E, float rate) {
  const int64_t l = blockIdx.x, e = threadIdx.x;
  if (e >= E) return;
  const float* counts = acc + l * (kMoeStatsHead + E) + kMoeStatsHead;
  double sum = 0;
  for (int64_t i = 0; i < E; ++i) sum += counts[i];
  const double offset = sum - static_cast<double>(E) * counts[e];
  bias[l * E + e] += rate * (offset > 0 ? 1.0f : offset < 0 ? -1.0f : 0.0f);
}

// One load-balancing type (moe_balance_finish): G groups of n tokens, the gradient per score into dscale's Gd rows.
__global__ void balance_finish_kernel(float* dscale, int64_t Gd, bool add, float* value, const float* counts_aux, const float* probsum, float coeff,
                                      int64_t E, int64_t k, int64_t G, int64_t n, float* global, bool accumulate) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const double C = static_cast<double>(E) / (static_cast<double>(k) * static_cast<double>(n) * static_cast<double>(n)) / static_cast<double>(G);
  if (global && accumulate) {  // (global_aux_loss: G is 1)
    for (int64_t e = 0; e < E; ++e) global[e] += counts_aux[e];
    global[E] += 1.0f;
  }
  const bool averaged = global && global[E] > 0.0f;  // (an evaluation forward before any training one: its own counts)
  double sum = 0;
  for (int64_t i = 0; i < G * E; ++i) {
    const double count = averaged ? static_cast<double>(global[i]) / global[E] : static_cast<double>(counts_aux[i]);
    sum += static_cast<double>(probsum[i]) * count;
    const float d = static_cast<float>(coeff * C * count);
    // (G is Gd, or 1: a batch-level type's row enters each of the Gd groups' rows)
    for (int64_t row = G == Gd ? i / E : 0; row < (G == Gd ? i / E + 1 : Gd); ++row) {
      float& to = dscale[row * E + i % E];
      to = add ? to + d : d;
    }
  }
  if (value) value[0] += static_cast<float>(C * sum);
}

__global__ void stats_finish_kernel(float* acc, const float* z, const int32_t* counts, bool zloss, int64_t T, int64_t E) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (zloss) acc[kMoeStatsHead - 1] += z[0] / static_cast<float>(T);
  for (int64_t e = 0; e < E; ++e) acc[kMoeStatsHead + e] += static_cast<float>(counts[e]);
}

__global__ void router_backward_kernel(float* dlogits, const float* logits, const int32_t* top, const float* dweight, const float* dscale, float z_coeff,
                                       float lm_grad_scale, MoeRouting r, const float* loss_scale) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= r.tokens) return;
  // (fp16: the aux and z terms times the loss scale, as the lm loss's gradient that dweight carries already)
  const float grad_scale = loss_scale ? lm_grad_scale * *loss_scale : lm_grad_scale;
  const int E = static_cast<int>(r.experts), k = static_cast<int>(r.topk);
  const float* x = logits + t * E;
  float* dx = dlogits + t * E;
  const int32_t* idx = top + t * k;
  for (int e = 0; e < E; ++e) dx[e] = 0.0f;
  double dp[kMaxExperts];
  for (int j = 0; j < k; ++j) dp[j] = static_cast<double>(dweight[t * k + j]) * r.scaling;
  // Through the routing weights (router.cpp's route_topk_backward).
  if (r.sigmoid) {
    double s[kMaxExperts];
    for (int j = 0; j < k; ++j) s[j] = elementwise_score(r, x[idx[j]]);
    if (k > 1) {
      double sum = 1e-20, dot = 0;
      for (int j = 0; j < k; ++j) sum += s[j];
      for (int j = 0; j < k; ++j) dot += dp[j] * s[j];
      for (int j = 0; j < k; ++j) dp[j] = dp[j] / sum - dot / (sum * sum);
    }
    for (int j = 0; j < k; ++j) dx[idx[j]] += static_cast<float>(dp[j] * elementwise_slope(r, x[idx[j]], s[j]));
  } else if (r.pre_softmax) {
    float mx = x[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, x[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(x[e] - mx));
    double dot = 0;
    for (int j = 0; j < k; ++j) dot += dp[j] * (exp(static_cast<double>(x[idx[j]] - mx)) / sum);
    for (int e = 0; e < E; ++e) dx[e] = static_cast<float>(-(exp(static_cast<double>(x[e] - mx)) / sum) * dot);
    for (int j = 0; j < k; ++j) dx[idx[j]] += static_cast<float>((exp(static_cast<double>(x[idx[j]] - mx)) / sum) * dp[j]);
  } else {
    float mx = x[idx[0]];
    for (int j = 1; j < k; ++j) mx = fmaxf(mx, x[idx[j]]);
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += exp(static_cast<double>(x[idx[j]] - mx));
    double dot = 0;
    for (int j = 0; j < k; ++j) dot += dp[j] * (exp(static_cast<double>(x[idx[j]] - mx)) / sum);
    for (int j = 0; j < k; ++j) {
      const double p = exp(static_cast<double>(x[idx[j]] - mx)) / sum;
      dx[idx[j]] += static_cast<float>(p * (dp[j] - dot));
    }
  }
  if (!dscale && z_coeff <= 0.0f) return;
  float mx = x[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, x[e]);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(x[e] - mx));
  const double lse = mx + log(sum);
  if (dscale) {  // through the aux scores (router.cpp's aux_scores_backward), with the row of the token's group
    dscale += (t / r.balance_len()) * E;
    if (r.sigmoid) {
      double sg[kMaxExperts], tot = 1e-20, dot = 0;
      for (int e = 0; e < E; ++e) tot += (sg[e] = elementwise_score(r, x[e]));
      for (int e = 0; e < E; ++e) dot += static_cast<double>(dscale[e]) * sg[e];
      for (int e = 0; e < E; ++e) {
        const double ds = dscale[e] / tot - dot / (tot * tot);
        dx[e] += static_cast<float>(grad_scale * ds * elementwise_slope(r, x[e], sg[e]));
      }
    } else {
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += static_cast<double>(dscale[e]) * exp(static_cast<double>(x[e]) - lse);
      for (int e = 0; e < E; ++e) {
        const double p = exp(static_cast<double>(x[e]) - lse);
        dx[e] += static_cast<float>(grad_scale * p * (dscale[e] - dot));
      }
    }
  }
  if (z_coeff > 0.0f) {
    const double zs = static_cast<double>(z_coeff) / static_cast<double>(r.tokens * r.shards) * grad_scale;
    for (int e = 0; e < E; ++e) dx[e] += static_cast<float>(zs * 2.0 * lse * exp(static_cast<double>(x[e]) - lse));
  }
}

// kInputTokens tokens per block, so that each router weight read serves all of them; per element the slots' rows are
// summed in slot order, then the router's term in expert order.
constexpr int kInputTokens = 4;
template <int W, typename T16, bool Jitter>
__global__ void input_backward_kernel(T16* dxn, const T16* drows, const int32_t* row, const float* row_weight, const float* dlogits,
                                      const T16* w, int64_t T, int64_t E, int64_t k, int64_t h, MoeJitter jitter) {
  __shared__ float dl[kInputTokens][kMaxExperts];
  const int64_t t0 = blockIdx.x * static_cast<int64_t>(kInputTokens);
  const int tokens = static_cast<int>(T - t0 < kInputTokens ? T - t0 : kInputTokens);
  for (int64_t x = threadIdx.x; x < kInputTokens * E; x += blockDim.x) dl[x / E][x % E] = x / E < tokens ? dlogits[(t0 + x / E) * E + x % E] : 0.0f;
  __syncthreads();
  for (int64_t c = threadIdx.x * W; c < h; c += blockDim.x * W) {
    Cols<W> s[kInputTokens] = {};
    for (int u = 0; u < tokens; ++u) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row[(t0 + u) * k + j];
        if (r < 0) continue;
        const Cols<W> v = load_cols<W>(drows + r * h + c);
        const float wj = row_weight ? row_weight[(t0 + u) * k + j] : 1.0f;
#pragma unroll
        for (int q = 0; q < W; ++q) s[u].x[q] += wj * v.x[q];
      }
    }
    if constexpr (Jitter) {  // (the router's term apart, then times its elements' noise, as the CPU engine's)
      Cols<W> rt[kInputTokens] = {};
      for (int64_t e = 0; e < E; ++e) {
        const Cols<W> we = load_cols<W>(w + e * h + c);
#pragma unroll
        for (int u = 0; u < kInputTokens; ++u) {
#pragma unroll
          for (int q = 0; q < W; ++q) rt[u].x[q] += dl[u][e] * we.x[q];
        }
      }
      for (int u = 0; u < tokens; ++u) {
        const int64_t t = t0 + u, sample = jitter.first_sample + t / jitter.seq_length, position = t % jitter.seq_length;
#pragma unroll
        for (int q = 0; q < W; ++q) {
          s[u].x[q] += rt[u].x[q] * moe_input_jitter(jitter.key, jitter.eps, jitter.layer, sample, position, jitter.seq_length, h, c + q);
        }
      }
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const Cols<W> we = load_cols<W>(w + e * h + c);
#pragma unroll
        for (int u = 0; u < kInputTokens; ++u) {
#pragma unroll
          for (int q = 0; q < W; ++q) s[u].x[q] += dl[u][e] * we.x[q];
        }
      }
    }
    for (int u = 0; u < tokens; ++u) store_cols<W>(dxn + (t0 + u) * h + c, s[u]);
  }
}

// The router's weight gradient in two deterministic passes: block (column chunk, expert tile, part) sums its part of the
// tokens into partial[part, e, c] for up to kWgradTile experts at once, so that each token's row of xn is read once per
// tile rather than once per expert; then each (e, c) adds its parts in order.
constexpr int kWgradParts = 64;
constexpr int kWgradTile = 8;
template <typename T16>
__global__ void router_wgrad_partial_kernel(float* partial, const float* dlogits, const T16* xn, int64_t T, int64_t E, int64_t h) {
  const int64_t e0 = blockIdx.y * static_cast<int64_t>(kWgradTile), part = blockIdx.z, c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  const int tile = static_cast<int>(E - e0 < kWgradTile ? E - e0 : kWgradTile);
  const int64_t per = (T + kWgradParts - 1) / kWgradParts, t0 = part * per, t1 = t0 + per < T ? t0 + per : T;
  float s[kWgradTile] = {};
  for (int64_t t = t0; t < t1; ++t) {
    const float x = to_f(xn[t * h + c]);
    const float* dl = dlogits + t * E + e0;
#pragma unroll
    for (int j = 0; j < kWgradTile; ++j) {
      if (j < tile) s[j] += dl[j] * x;
    }
  }
  for (int j = 0; j < tile; ++j) partial[(part * E + e0 + j) * h + c] = s[j];
}
__global__ void router_wgrad_sum_kernel(float* dw, const float* partial, int64_t E, int64_t h) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= E * h) return;
  float s = 0.0f;
  for (int p = 0; p < kWgradParts; ++p) s += partial[p * E * h + i];
  dw[i] += s;
}

template <typename T16>
__global__ void input_jitter_kernel(T16* out, const T16* xn, int64_t T, int64_t h, MoeJitter j) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * h) return;
  const int64_t t = i / h, sample = j.first_sample + t / j.seq_length, position = t % j.seq_length;
  out[i] = from_f<T16>(to_f(xn[i]) * moe_input_jitter(j.key, j.eps, j.layer, sample, position, j.seq_length, h, i % h));
}

__global__ void random_logits_kernel(float* logits, int64_t T, int64_t E, uint64_t key, int64_t layer, int64_t first_sample, int64_t S) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * E) return;
  const int64_t t = i / E;
  logits[i] = moe_random_logit(key, layer, first_sample + t / S, t % S, S, E, i % E);
}

// The run's 16-bit type: f(tag) with a value of it, whose type the launcher reads its bf16*-typed buffers as (P<T16>).
template <typename F>
void with_type(F16 dt, F&& f) {
  if (dt == F16::kFP16) f(__half{});
  else f(__nv_bfloat16{});
}
template <typename T16>
const T16* P(const bf16* p) { return reinterpret_cast<const T16*>(p); }
template <typename T16>
T16* P(bf16* p) { return reinterpret_cast<T16*>(p); }
unsigned blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

void moe_router_logits(float* logits, const bf16* xn, const bf16* w, const MoeRouting& r, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    logits_kernel<float, T16><<<blocks(r.tokens * r.experts * 32, 256), 256, 0, st>>>(logits, P<T16>(xn), P<T16>(w), nullptr, r.tokens, r.experts,
        r.hidden);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_router_logits_fp64(float* logits, const bf16* xn, const bf16* w, const bf16* b, const MoeRouting& r, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    logits_kernel<double, T16><<<blocks(r.tokens * r.experts * 32, 256), 256, 0, st>>>(logits, P<T16>(xn), P<T16>(w), b ? P<T16>(b) : nullptr,
        r.tokens, r.experts, r.hidden);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_jitter_router_input(bf16* out, const bf16* xn, const MoeRouting& r, const MoeJitter& j, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    input_jitter_kernel<T16><<<blocks(r.tokens * r.hidden, 256), 256, 0, st>>>(P<T16>(out), P<T16>(xn), r.tokens, r.hidden, j);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_random_logits(float* logits, const MoeRouting& r, uint64_t key, int64_t layer, int64_t first_sample, int64_t seq_length, cudaStream_t st) {
  random_logits_kernel<<<blocks(r.tokens * r.experts, 256), 256, 0, st>>>(logits, r.tokens, r.experts, key, layer, first_sample, seq_length);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_route(int32_t* top, float* weight, const float* logits, const MoeRouting& r, cudaStream_t st, const float* expert_bias,
               const float* choice) {
  if (r.experts > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  route_kernel<<<blocks(r.tokens, 128), 128, 0, st>>>(top, weight, logits, r, expert_bias, choice);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_sinkhorn(float* out, float* scratch, const float* logits, const MoeRouting& r, cudaStream_t st) {
  if (r.experts > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  sinkhorn_kernel<<<1, kSinkhornThreads, 0, st>>>(out, scratch, logits, r.tokens, static_cast<int>(r.experts));
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_update_expert_bias(float* bias, const float* acc, int64_t layers, int64_t E, float rate, cudaStream_t st) {
  if (layers <= 0) return;
  if (E > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  update_expert_bias_kernel<<<static_cast<unsigned>(layers), kMaxExperts, 0, st>>>(bias, acc, E, rate);
  MT_CUDA_CHECK(cudaGetLastError());
}

int64_t moe_permute_scratch(const MoeRouting& r) { return (r.tokens * r.topk + kPermuteChunk - 1) / kPermuteChunk * r.experts; }

void moe_permute(int32_t* row, int32_t* counts, int32_t* offsets, int32_t* parts, const int32_t* top, const MoeRouting& r, cudaStream_t st) {
  if (r.experts > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  const int64_t n = r.tokens * r.topk, chunks = (n + kPermuteChunk - 1) / kPermuteChunk;
  if (chunks == 0) {
    MT_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(r.experts) * 4, st));
    MT_CUDA_CHECK(cudaMemsetAsync(offsets, 0, static_cast<size_t>(r.experts + 1) * 4, st));
    return;
  }
  permute_count_kernel<<<static_cast<unsigned>(chunks), kPermuteChunk, 0, st>>>(parts, top, n, r.experts);
  MT_CUDA_CHECK(cudaGetLastError());
  permute_scan_kernel<<<1, kMaxExperts, 0, st>>>(parts, counts, offsets, chunks, r.experts, static_cast<int32_t>(r.row_align));
  MT_CUDA_CHECK(cudaGetLastError());
  permute_place_kernel<<<static_cast<unsigned>(chunks), kPermuteChunk, 0, st>>>(row, parts, top, n, r.experts);
  MT_CUDA_CHECK(cudaGetLastError());
}

namespace {
// Eight columns a thread when the hidden size and every buffer allow 16-byte accesses.
bool eight_wide(int64_t h, std::initializer_list<const void*> buffers) {
  if (h % 8 != 0) return false;
  for (const void* p : buffers) {
    if (!aligned16(p)) return false;
  }
  return true;
}
}  // namespace

void moe_gather(bf16* rows, const bf16* xn, const int32_t* row, const MoeRouting& r, cudaStream_t st, F16 dt, const float* row_weight) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    if (eight_wide(r.hidden, {rows, xn})) {
      gather_kernel<8, T16><<<static_cast<unsigned>(r.tokens), 128, 0, st>>>(P<T16>(rows), P<T16>(xn), row, row_weight, r.tokens, r.topk, r.hidden);
    } else {
      gather_kernel<1, T16><<<static_cast<unsigned>(r.tokens), 128, 0, st>>>(P<T16>(rows), P<T16>(xn), row, row_weight, r.tokens, r.topk, r.hidden);
    }
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_pad_rows(bf16* rows, const bf16* xn, const int32_t* map, int64_t n, int64_t h, cudaStream_t st, F16 dt) {
  if (n == 0) return;
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    if (eight_wide(h, {rows, xn})) {
      pad_rows_kernel<8, T16><<<static_cast<unsigned>(n), 128, 0, st>>>(P<T16>(rows), P<T16>(xn), map, n, h);
    } else {
      pad_rows_kernel<1, T16><<<static_cast<unsigned>(n), 128, 0, st>>>(P<T16>(rows), P<T16>(xn), map, n, h);
    }
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_combine(bf16* out, const bf16* y, const int32_t* row, const float* weight, const MoeRouting& r, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    if (eight_wide(r.hidden, {out, y})) {
      combine_kernel<8, T16><<<static_cast<unsigned>(r.tokens), 128, 0, st>>>(P<T16>(out), P<T16>(y), row, weight, r.tokens, r.topk, r.hidden);
    } else {
      combine_kernel<1, T16><<<static_cast<unsigned>(r.tokens), 128, 0, st>>>(P<T16>(out), P<T16>(y), row, weight, r.tokens, r.topk, r.hidden);
    }
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_combine_backward(bf16* dy_rows, float* dweight, const bf16* dout, const bf16* y, const int32_t* row, const float* weight, const MoeRouting& r,
                          cudaStream_t st, F16 dt) {
  const auto blocks_n = static_cast<unsigned>(r.tokens * r.topk);
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    if (eight_wide(r.hidden, {dy_rows, dout, y})) {
      combine_backward_kernel<8, T16><<<blocks_n, 128, 0, st>>>(P<T16>(dy_rows), dweight, P<T16>(dout), P<T16>(y), row, weight, r.tokens * r.topk,
          r.topk, r.hidden);
    } else {
      combine_backward_kernel<1, T16><<<blocks_n, 128, 0, st>>>(P<T16>(dy_rows), dweight, P<T16>(dout), P<T16>(y), row, weight, r.tokens * r.topk,
          r.topk, r.hidden);
    }
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_aux_stats(float* scores, float* counts_aux, float* probsum, float* z, const float* logits, const MoeRouting& r, cudaStream_t st) {
  const int64_t G = r.balance_groups();
  MT_CUDA_CHECK(cudaMemsetAsync(counts_aux, 0, static_cast<size_t>(G * r.experts) * 4, st));
  float* lse2 = z + 1;  // z: [1 + T] (the sum, then each token's lse^2)
  aux_scores_kernel<<<blocks(r.tokens, 128), 128, 0, st>>>(scores, counts_aux, lse2, logits, r);
  MT_CUDA_CHECK(cudaGetLastError());
  column_sums_kernel<<<static_cast<unsigned>(G * r.experts + 1), 256, 0, st>>>(probsum, z, scores, lse2, r.tokens, r.experts, G, r.balance_len());
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_balance_finish(float* dscale, int64_t dscale_groups, bool add, float* value, const float* counts_aux, const float* probsum, float coeff,
                        const MoeRouting& r, cudaStream_t st, float* global, bool accumulate) {
  const int64_t G = r.balance_groups();
  if (G != dscale_groups && G != 1) throw std::logic_error("moe_balance_finish: statistics of " + std::to_string(G) + " groups for a gradient of " +
                                                           std::to_string(dscale_groups));
  if (global && G != 1) throw std::logic_error("moe_balance_finish: global_aux_loss's statistics per sequence");
  balance_finish_kernel<<<1, 32, 0, st>>>(dscale, dscale_groups, add, value, counts_aux, probsum, coeff, r.experts, r.topk, G, r.balance_len() * r.shards,
                                          global, accumulate);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_stats_finish(float* acc, const float* z, const int32_t* counts, bool zloss, const MoeRouting& r, cudaStream_t st) {
  stats_finish_kernel<<<1, 32, 0, st>>>(acc, z, counts, zloss, r.tokens * r.shards, r.experts);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_router_backward(float* dlogits, const float* logits, const int32_t* top, const float* dweight, const float* dscale, float z_coeff,
                         float grad_scale, const MoeRouting& r, cudaStream_t st, const float* loss_scale) {
  router_backward_kernel<<<blocks(r.tokens, 128), 128, 0, st>>>(dlogits, logits, top, dweight, dscale, z_coeff, grad_scale, r, loss_scale);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_input_backward(bf16* dxn, const bf16* drows, const int32_t* row, const float* dlogits, const bf16* w, const MoeRouting& r, cudaStream_t st,
                        F16 dt, const float* row_weight, const MoeJitter* jitter) {
  if (r.experts > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  const unsigned grid = blocks(r.tokens, kInputTokens);
  const MoeJitter j = jitter ? *jitter : MoeJitter{};
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    const bool wide = eight_wide(r.hidden, {dxn, drows, w});
    auto launch = [&](auto kernel) {
      kernel<<<grid, 128, 0, st>>>(P<T16>(dxn), P<T16>(drows), row, row_weight, dlogits, P<T16>(w), r.tokens, r.experts, r.topk, r.hidden, j);
    };
    if (jitter) {
      wide ? launch(input_backward_kernel<8, T16, true>) : launch(input_backward_kernel<1, T16, true>);
    } else {
      wide ? launch(input_backward_kernel<8, T16, false>) : launch(input_backward_kernel<1, T16, false>);
    }
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_router_wgrad(float* dw, float* partial, const float* dlogits, const bf16* xn, const MoeRouting& r, cudaStream_t st, F16 dt) {
  const dim3 grid(blocks(r.hidden, 128), blocks(r.experts, kWgradTile), kWgradParts);
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    router_wgrad_partial_kernel<T16><<<grid, 128, 0, st>>>(partial, dlogits, P<T16>(xn), r.tokens, r.experts, r.hidden);
    MT_CUDA_CHECK(cudaGetLastError());
    router_wgrad_sum_kernel<<<blocks(r.experts * r.hidden, 256), 256, 0, st>>>(dw, partial, r.experts, r.hidden);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

int64_t moe_router_wgrad_scratch(const MoeRouting& r) { return kWgradParts * r.experts * r.hidden; }

namespace {

template <typename T16>
__global__ void router_bias_kernel(float* logits, const T16* b, int64_t T, int64_t E) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < T * E) logits[i] += to_f(b[i % E]);
}

// One block per expert: its column of dlogits summed by 256 threads (strided, in token order), then a fixed tree.
__global__ void router_bias_grad_kernel(float* db, const float* dlogits, int64_t T, int64_t E) {
  __shared__ float part[256];
  const int64_t e = blockIdx.x;
  float sum = 0.0f;
  for (int64_t t = threadIdx.x; t < T; t += blockDim.x) sum += dlogits[t * E + e];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[e] += part[0];
}

}  // namespace

void moe_router_bias(float* logits, const bf16* b, const MoeRouting& r, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    router_bias_kernel<T16><<<blocks(r.tokens * r.experts, 256), 256, 0, st>>>(logits, P<T16>(b), r.tokens, r.experts);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

namespace {

template <typename T16>
__global__ void shared_gate_forward_kernel(float* gate, T16* delta, const T16* shared, const T16* xn, const T16* w, int64_t T, int64_t h) {
  const int64_t t = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  float dot = 0;
  for (int64_t i = lane; i < h; i += 32) dot += to_f(xn[t * h + i]) * to_f(w[i]);
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  const float s = sigm(dot);
  if (lane == 0) gate[t] = s;
  for (int64_t i = lane; i < h; i += 32) delta[t * h + i] = from_f<T16>(to_f(delta[t * h + i]) + s * to_f(shared[t * h + i]));
}

template <typename T16>
__global__ void shared_gate_backward_kernel(T16* dshared, float* dlogit, T16* dxn, const T16* dy, const T16* shared, const float* gate,
                                            const T16* w, int64_t T, int64_t h) {
  const int64_t t = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (t >= T) return;
  const float s = gate[t];
  float dot = 0;
  for (int64_t i = lane; i < h; i += 32) {
    const float d = to_f(dy[t * h + i]);
    dot += d * to_f(shared[t * h + i]);
    dshared[t * h + i] = from_f<T16>(s * d);
  }
  for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  const float dl = dot * s * (1.0f - s);
  if (lane == 0) dlogit[t] = dl;
  for (int64_t i = lane; i < h; i += 32) dxn[t * h + i] = from_f<T16>(to_f(dxn[t * h + i]) + dl * to_f(w[i]));
}

}  // namespace

void moe_shared_gate_forward(float* gate, bf16* delta, const bf16* shared, const bf16* xn, const bf16* w, int64_t T, int64_t h, cudaStream_t st,
                             F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    shared_gate_forward_kernel<T16><<<blocks(T * 32, 256), 256, 0, st>>>(gate, P<T16>(delta), P<T16>(shared), P<T16>(xn), P<T16>(w), T, h);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_shared_gate_backward(bf16* dshared, float* dlogit, bf16* dxn, const bf16* dy, const bf16* shared, const float* gate, const bf16* w,
                              int64_t T, int64_t h, cudaStream_t st, F16 dt) {
  with_type(dt, [&](auto tag) {
    using T16 = decltype(tag);
    shared_gate_backward_kernel<T16><<<blocks(T * 32, 256), 256, 0, st>>>(P<T16>(dshared), dlogit, P<T16>(dxn), P<T16>(dy), P<T16>(shared), gate,
                                                                         P<T16>(w), T, h);
    MT_CUDA_CHECK(cudaGetLastError());
  });
}

void moe_router_bias_grad(float* db, const float* dlogits, const MoeRouting& r, cudaStream_t st) {
  router_bias_grad_kernel<<<static_cast<unsigned>(r.experts), 256, 0, st>>>(db, dlogits, r.tokens, r.experts);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
