// activation.cpp: reference activations.
#include "kernels/cpu/activation.h"

#include <algorithm>
#include <cmath>

namespace mt::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace

void gelu_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float inner = kSqrt2OverPi * (v + kCoeff * v * v * v);
    const float t = std::tanh(inner);
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  }
}

void gelu_erf_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kSqrtHalf));
}

void gelu_erf_backward(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    dx[i] = dy[i] * (0.5f * (1.0f + std::erf(v * kSqrtHalf)) + v * kInvSqrt2Pi * std::exp(-0.5f * v * v));
  }
}

void squared_relu_forward(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] * x[i] : 0.0f;
}

void squared_relu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? 2.0f * x[i] * dy[i] : 0.0f;
}

namespace {

// The clamped gate and linear inputs, and whether each passes its gradient (torch.clamp's: inside or on a bound).
struct GatedInputs {
  float g, u;
  bool g_passes, u_passes;
};
GatedInputs gated_inputs(float g, float u, const GatedActivation& a) {
  if (a.clamp <= 0.0f) return {g, u, true, true};
  return {std::min(g, a.clamp), std::clamp(u, -a.clamp, a.clamp), g <= a.clamp, u >= -a.clamp && u <= a.clamp};
}

}  // namespace

void gated_forward(float* y, const float* x, int64_t N, int64_t F, const GatedActivation& a) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = x + n * 2 * F;
    const float* u = g + F;
    float* o = y + n * F;
    for (int64_t i = 0; i < F; ++i) {
      const GatedInputs in = gated_inputs(g[i], u[i], a);
      const float s = 1.0f / (1.0f + std::exp(-a.alpha * in.g));
      o[i] = in.g * s * (in.u + a.linear_offset);
    }
  }
}

void gated_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F, const GatedActivation& a) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = x + n * 2 * F;
    const float* u = g + F;
    const float* d = dy + n * F;
    float* dg = dx + n * 2 * F;
    float* du = dg + F;
    for (int64_t i = 0; i < F; ++i) {
      const GatedInputs in = gated_inputs(g[i], u[i], a);
      const float s = 1.0f / (1.0f + std::exp(-a.alpha * in.g));
      const float act = in.g * s;
      const float dgi = in.g_passes ? d[i] * (in.u + a.linear_offset) * (s * (1.0f + a.alpha * in.g * (1.0f - s))) : 0.0f;
      du[i] = in.u_passes ? d[i] * act : 0.0f;
      dg[i] = dgi;
    }
  }
}

// SwiGLU: the gated unit with SiLU, no offset, no clamp (the same arithmetic).
void swiglu_forward(float* y, const float* x, int64_t N, int64_t F) { gated_forward(y, x, N, F, GatedActivation{}); }
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F) { gated_backward(dx, dy, x, N, F, GatedActivation{}); }

}  // namespace mt::cpu
