// activation.h: GELU (tanh form, as Megatron's bias_gelu; or the exact erf form, its F.gelu), squared ReLU and SwiGLU,
// forward and backward.
#pragma once
#include <cstdint>

#include "kernels/gated_activation.h"

namespace mt::cpu {

void gelu_forward(float* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);  // dx may alias dy
// The exact form, x Phi(x) = x (1 + erf(x / sqrt 2)) / 2: Megatron's activation without the bias-GELU fusion
// (--no-bias-gelu-fusion, or no biases: --disable-bias-linear turns the fusion off). dx may alias dy.
void gelu_erf_forward(float* y, const float* x, int64_t n);
void gelu_erf_backward(float* dx, const float* dy, const float* x, int64_t n);

// y = relu(x)^2 (--squared-relu); dx may alias dy.
void squared_relu_forward(float* y, const float* x, int64_t n);
void squared_relu_backward(float* dx, const float* dy, const float* x, int64_t n);

// x: [N, 2F], each row [gate (F) | up (F)]; y: [N, F] = silu(gate) * up.
void swiglu_forward(float* y, const float* x, int64_t N, int64_t F);
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F);
// The general gated unit of kernels/gated_activation.h (quick GeGLU, a linear offset, a clamp); the same rows.
void gated_forward(float* y, const float* x, int64_t N, int64_t F, const GatedActivation& a);
void gated_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F, const GatedActivation& a);

}  // namespace mt::cpu
