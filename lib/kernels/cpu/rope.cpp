// rope.cpp: reference RoPE; angles in double so the CPU oracle is exact to fp32.
#include "kernels/cpu/rope.h"

#include <cmath>

#include "kernels/rope_frequencies.h"

namespace mt::cpu {
namespace {

void rotate(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, float sign, bool interleaved,
            const RopeScaling& scaling) {
  const int64_t half = rot_dim / 2;
  const std::vector<double> inv_freq = rope_inverse_frequencies(rot_dim, static_cast<double>(base), scaling);
  const double factor = rope_attention_factor(scaling);  // (YaRN's: the rotation scaled, its transpose for the backward)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(positions[t]) * inv_freq[static_cast<size_t>(i)];
      const float c = static_cast<float>(factor * std::cos(ang)), s = sign * static_cast<float>(factor * std::sin(ang));
      for (int64_t hh = 0; hh < H; ++hh) {
        float* row = x + (t * H + hh) * d;
        const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        const float x1 = row[a], x2 = row[b];
        row[a] = x1 * c - x2 * s;
        row[b] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved, const RopeScaling& scaling) {
  rotate(x, positions, T, H, d, rot_dim, base, 1.0f, interleaved, scaling);
}

void rope_backward(float* dx, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved,
                   const RopeScaling& scaling) {
  rotate(dx, positions, T, H, d, rot_dim, base, -1.0f, interleaved, scaling);
}

}  // namespace mt::cpu
