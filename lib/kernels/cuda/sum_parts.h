// sum_parts.h (CUDA): out[i] = sum over p < parts of in[p * n + i], 16-bit in and out, fp32 sums in the
// order p = 0, 1, ... (the same on every rank): the reduction half of a tensor-parallel all-reduce done as a
// gather (the copy engines move the partial sums; this kernel adds them up).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void sum_parts_bf16(bf16* out, const bf16* in, int64_t parts, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);

}  // namespace mt::cuda
