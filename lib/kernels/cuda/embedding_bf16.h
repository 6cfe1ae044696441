// embedding_bf16.h (CUDA): the embedding lookup from bf16 working weights into the fp32 residual stream:
// out[t] = wte[tokens[t] - vocab_start] for tokens in this rank's vocabulary shard [vocab_start,
// vocab_start + vocab_local), 0 for the others (tensor parallelism sums the shards), + wpe[positions[t]] when
// wpe is given (learned absolute positions; one TP rank adds them). The backward is embedding.h's
// deterministic CSR kernel on the fp32 residual gradient.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void embedding_forward_bf16(float* out, const int32_t* tokens, const int32_t* positions, const bf16* wte, const bf16* wpe, int64_t T,
                            int64_t h, int64_t vocab_start, int64_t vocab_local, cudaStream_t stream, F16 t = F16::kBF16);

}  // namespace mt::cuda
