// dropout.h: dropout whose mask is a pure function of (key, element index): backward and recompute
// regenerate it instead of storing it.
#pragma once
#include <cstdint>

namespace mt::cpu {

// y = x * keep / (1 - p); keep = uniform(key, offset + i) >= p. y may alias x.
void dropout_forward(float* y, const float* x, int64_t n, float p, uint64_t key, uint64_t offset);
void dropout_backward(float* dx, const float* dy, int64_t n, float p, uint64_t key, uint64_t offset);

}  // namespace mt::cpu
