// bias_grad.h (CUDA): db[n] += sum over rows of dy[:, n] for bf16 dy [N, n], fp32 accumulation,
// deterministic (per-block partial sums, then a fixed-order column sum).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void bias_grad_bf16(float* db, const bf16* dy, int64_t N, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);
// y[i] += x[i] (a bias gradient from a GEMM epilogue, which writes, into the accumulated gradient).
void add_f32(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace mt::cuda
