// moe_quantile.cu: see moe_quantile.h.
#include "kernels/cuda/moe_quantile.h"

#include <stdexcept>
#include <string>

#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kMaxExperts = 256;
constexpr int kSelectThreads = 256;

// A thread per token: the choice row, and its (k + 1)-th largest value (as std::nth_element with greater: the value
// at place k of the row sorted in descending order) by k + 1 rounds of taking the largest not yet taken.
__global__ void quantile_scores_kernel(float* choice, float* shifted, const float* logits, const float* beta, int64_t T, int E, int k) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* x = logits + t * E;
  float* c = choice + t * E;
  for (int e = 0; e < E; ++e) c[e] = x[e] - beta[e];
  if (!shifted) return;
  bool taken[kMaxExperts];
  for (int e = 0; e < E; ++e) taken[e] = false;
  float alpha = 0.0f;
  for (int j = 0; j <= k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!taken[e] && (best < 0 || c[e] > c[best])) best = e;
    }
    taken[best] = true;
    alpha = c[best];
  }
  float* s = shifted + t * E;
  for (int e = 0; e < E; ++e) s[e] = x[e] - alpha;
}

// The floats' bits as unsigned keys in descending order of the values: a larger float, a smaller key.
__device__ __forceinline__ uint32_t descending_key(float v) {
  const uint32_t u = __float_as_uint(v);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;
}
__device__ __forceinline__ float key_value(uint32_t key) {
  const uint32_t ascending = ~key;
  return __uint_as_float((ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending);
}

// A block per expert: the element at place `target` (0-based) of column e of shifted[m, E] in descending order, by
// four passes over the key's bytes from the top, each counting the column's keys that match the prefix found so far.
__global__ void column_select_kernel(float* acc, const float* shifted, int64_t m, int64_t E, int64_t target) {
  const int64_t e = blockIdx.x;
  __shared__ uint32_t histogram[256];
  __shared__ uint32_t prefix, mask;
  __shared__ int64_t rank;
  if (threadIdx.x == 0) {
    prefix = 0;
    mask = 0;
    rank = target;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    const uint32_t want = prefix, within = mask;
    for (int64_t t = threadIdx.x; t < m; t += blockDim.x) {
      const uint32_t key = descending_key(shifted[t * E + e]);
      if ((key & within) == want) atomicAdd(&histogram[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // (the digit whose keys hold place `rank`, and the place within them)
      int64_t below = 0;
      int digit = 0;
      for (; digit < 255 && below + histogram[digit] <= rank; ++digit) below += histogram[digit];
      rank -= below;
      prefix |= static_cast<uint32_t>(digit) << shift;
      mask |= 0xffu << shift;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    acc[e] += key_value(prefix);
    if (e == 0) acc[E] += 1.0f;
  }
}

// A thread per layer: the CPU engine's arithmetic (GPTModel::update_quantile_biases), in double, the centre summed in
// expert order.
__global__ void update_quantile_bias_kernel(float* beta, float* acc, int64_t layers, int64_t E, double ema) {
  const int64_t l = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (l >= layers) return;
  float* a = acc + l * (E + 1);
  float* b = beta + l * E;
  const double count = a[E] > 1.0f ? static_cast<double>(a[E]) : 1.0;
  double blended[kMaxExperts];
  double centre = 0;
  for (int64_t e = 0; e < E; ++e) {
    // (rounded products and sum, no fused multiply-add: the host's arithmetic)
    blended[e] = __dadd_rn(__dmul_rn(ema, static_cast<double>(b[e])), __dmul_rn(1.0 - ema, static_cast<double>(a[e]) / count));
    centre += blended[e] / static_cast<double>(E);
  }
  for (int64_t e = 0; e < E; ++e) {
    b[e] = static_cast<float>(blended[e] - centre);
    a[e] = 0.0f;
  }
  a[E] = 0.0f;
}

unsigned blocks(int64_t n, int64_t per) { return static_cast<unsigned>((n + per - 1) / per); }

}  // namespace

void moe_quantile_scores(float* choice, float* shifted, const float* logits, const float* beta, const MoeRouting& r, cudaStream_t st) {
  if (r.experts > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  if (r.topk >= r.experts) throw std::invalid_argument("quantile balancing: top-k must be below the experts");
  quantile_scores_kernel<<<blocks(r.tokens, 128), 128, 0, st>>>(choice, shifted, logits, beta, r.tokens, static_cast<int>(r.experts),
                                                                static_cast<int>(r.topk));
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_quantile_accumulate(float* acc, const float* shifted, const MoeRouting& r, cudaStream_t st) {
  const int64_t m = r.tokens, target = m * r.topk / r.experts;
  if ((m * r.topk) % r.experts != 0 || target >= m) {
    throw std::invalid_argument("quantile balancing: the tokens' choices (" + std::to_string(m * r.topk) + ") not a multiple of the " +
                                std::to_string(r.experts) + " experts");
  }
  column_select_kernel<<<static_cast<unsigned>(r.experts), kSelectThreads, 0, st>>>(acc, shifted, m, r.experts, target);
  MT_CUDA_CHECK(cudaGetLastError());
}

void moe_update_quantile_bias(float* beta, float* acc, int64_t layers, int64_t E, double ema, cudaStream_t st) {
  if (layers <= 0) return;
  if (E > kMaxExperts) throw std::runtime_error("the CUDA MoE router supports at most 256 experts");
  update_quantile_bias_kernel<<<blocks(layers, 32), 32, 0, st>>>(beta, acc, layers, E, ema);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
