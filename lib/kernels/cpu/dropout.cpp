// dropout.cpp: counter-based dropout.
#include "kernels/cpu/dropout.h"

#include "tensor/rng.h"

namespace mt::cpu {

void dropout_forward(float* y, const float* x, int64_t n, float p, uint64_t key, uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = philox_uniform(key, offset + static_cast<uint64_t>(i)) >= p;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

void dropout_backward(float* dx, const float* dy, int64_t n, float p, uint64_t key, uint64_t offset) {
  dropout_forward(dx, dy, n, p, key, offset);
}

}  // namespace mt::cpu
