// rope.cpp: reference RoPE; angles in double so the CPU oracle is exact to fp32.
#include "kernels/cpu/rope.h"

#include <cmath>

namespace mt::cpu {
namespace {

void rotate(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, float sign) {
  const int64_t half = rot_dim / 2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
      const double ang = static_cast<double>(positions[t]) * inv_freq;
      const float c = static_cast<float>(std::cos(ang)), s = sign * static_cast<float>(std::sin(ang));
      for (int64_t hh = 0; hh < H; ++hh) {
        float* row = x + (t * H + hh) * d;
        const float x1 = row[i], x2 = row[i + half];
        row[i] = x1 * c - x2 * s;
        row[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base) {
  rotate(x, positions, T, H, d, rot_dim, base, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base) {
  rotate(dx, positions, T, H, d, rot_dim, base, -1.0f);
}

}  // namespace mt::cpu
