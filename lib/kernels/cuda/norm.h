// norm.h (CUDA): LayerNorm and RMSNorm forward and backward on device buffers, fp32, the same
// signatures as kernels/cpu/norm.h plus a stream. Weight gradients are reduced by a second kernel over
// columns (no atomics: deterministic).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N, int64_t h,
                       float eps, cudaStream_t stream);
// dx overwritten; dw, db accumulate. scratch: N floats x 2.
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t N, int64_t h, cudaStream_t stream);
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t h, float eps, cudaStream_t stream);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd, int64_t N,
                      int64_t h, cudaStream_t stream);

}  // namespace mt::cuda
