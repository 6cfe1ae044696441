// cross_entropy.cpp: reference (vocab-parallel) loss with double accumulation of the normaliser.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace mt::cpu {

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           int64_t vocab_start, const VocabReduce* reduce) {
  std::vector<float> mx(static_cast<size_t>(N)), sum(static_cast<size_t>(N)), tgt(static_cast<size_t>(N), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) m = std::max(m, row[i]);
    mx[static_cast<size_t>(n)] = m;
    const int64_t t = targets[n] - vocab_start;
    if (t >= 0 && t < V) tgt[static_cast<size_t>(n)] = row[t];
  }
  if (reduce) {
    reduce->max(mx.data(), N);
    reduce->sum(tgt.data(), N);
  }
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    const float m = mx[static_cast<size_t>(n)];
    double s = 0;
    for (int64_t i = 0; i < V; ++i) s += std::exp(static_cast<double>(row[i] - m));
    sum[static_cast<size_t>(n)] = static_cast<float>(s);
  }
  if (reduce) reduce->sum(sum.data(), N);
  for (int64_t n = 0; n < N; ++n) {
    const float l = mx[static_cast<size_t>(n)] + std::log(sum[static_cast<size_t>(n)]);
    lse[n] = l;
    losses[n] = l - tgt[static_cast<size_t>(n)];
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                            const float* dloss, int64_t N, int64_t V, int64_t vocab_start) {
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float* d = dlogits + n * V;
    const float g = dloss[n];
    for (int64_t i = 0; i < V; ++i) d[i] = std::exp(row[i] - lse[n]) * g;
    const int64_t t = targets[n] - vocab_start;
    if (t >= 0 && t < V) d[t] -= g;
  }
}

}  // namespace mt::cpu
