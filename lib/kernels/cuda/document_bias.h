// document_bias.h (CUDA): the attention bias of --reset-attention-mask (Megatron's get_ltor_masks_and_position_ids):
// a query at position i of a sample sees the keys from its document's first position row_start[i] on (and, by the
// causal mask applied with it, up to i). bias [B, 1, S, S] of the run's 16-bit type: 0 where the key is in the
// query's document or after it, a large finite negative before it (bf16 -1e30, fp16 -65504). cuDNN's attention adds it
// to the scaled scores (kernels/cuda/sdpa_cudnn.h), so a masked score's probability is exactly 0.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

// row_start [B * S]: each token's document start within its sample (Microbatch::row_start). S a multiple of 8.
void document_bias(bf16* bias, const int32_t* row_start, int64_t B, int64_t S, cudaStream_t stream, F16 type = F16::kBF16);

}  // namespace mt::cuda
