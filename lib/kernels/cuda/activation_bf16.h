// activation_bf16.h (CUDA): GELU (tanh or erf form), squared ReLU, SwiGLU and the other gated units on bf16 activations, fp32 math; the formulas of
// kernels/cpu/activation.h. SwiGLU's input row is [gate (F) | up (F)].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"
#include "kernels/gated_activation.h"

namespace mt::cuda {

// (erf: the exact form, kernels/cpu/activation.h's gelu_erf_*)
void gelu_forward_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t stream, F16 t = F16::kBF16, bool erf = false);
void gelu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t n, cudaStream_t stream, F16 t = F16::kBF16, bool erf = false);
// y = relu(x)^2; dx = 2 relu(x) dy (--squared-relu).
void squared_relu_forward_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);
void squared_relu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);
void swiglu_forward_bf16(bf16* y, const bf16* x, int64_t N, int64_t F, cudaStream_t stream, F16 t = F16::kBF16);
void swiglu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F, cudaStream_t stream, F16 t = F16::kBF16);
// A gated MLP's activation (kernels/gated_activation.h, the CPU's gated_forward / gated_backward): SwiGLU's kernels
// above where `a` is plain SwiGLU, else quick GeGLU, the linear offset and the clamp.
void glu_forward_bf16(bf16* y, const bf16* x, int64_t N, int64_t F, const GatedActivation& a, cudaStream_t stream, F16 t = F16::kBF16);
void glu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F, const GatedActivation& a, cudaStream_t stream,
                       F16 t = F16::kBF16);

}  // namespace mt::cuda
