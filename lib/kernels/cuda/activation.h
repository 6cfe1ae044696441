// activation.h (CUDA): GELU (tanh form) and SwiGLU forward and backward, fp32, the signatures of
// kernels/cpu/activation.h plus a stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

void gelu_forward(float* y, const float* x, int64_t n, cudaStream_t stream);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, cudaStream_t stream);
void swiglu_forward(float* y, const float* x, int64_t N, int64_t F, cudaStream_t stream);
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F, cudaStream_t stream);

}  // namespace mt::cuda
