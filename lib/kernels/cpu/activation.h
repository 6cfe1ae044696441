// activation.h: GELU (tanh form, as Megatron's bias_gelu) and SwiGLU, forward and backward.
#pragma once
#include <cstdint>

namespace mt::cpu {

void gelu_forward(float* y, const float* x, int64_t n);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);  // dx may alias dy

// y = relu(x)^2 (--squared-relu); dx may alias dy.
void squared_relu_forward(float* y, const float* x, int64_t n);
void squared_relu_backward(float* dx, const float* dy, const float* x, int64_t n);

// x: [N, 2F], each row [gate (F) | up (F)]; y: [N, F] = silu(gate) * up.
void swiglu_forward(float* y, const float* x, int64_t N, int64_t F);
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F);

}  // namespace mt::cpu
