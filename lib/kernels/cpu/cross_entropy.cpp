// cross_entropy.cpp: reference loss with double accumulation of the normaliser.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mt::cpu {

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, row[i]);
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
    const float l = mx + static_cast<float>(std::log(sum));
    lse[n] = l;
    losses[n] = l - row[targets[n]];
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                            const float* dloss, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits + n * V;
    float* d = dlogits + n * V;
    const float g = dloss[n];
    for (int64_t i = 0; i < V; ++i) d[i] = std::exp(row[i] - lse[n]) * g;
    d[targets[n]] -= g;
  }
}

}  // namespace mt::cpu
