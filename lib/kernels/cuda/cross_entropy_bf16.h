// cross_entropy_bf16.h (CUDA): fused softmax cross-entropy over bf16 logits [N, V] (one vocabulary shard,
// TP 1): online max / sum in fp32 (no fp32 probability tensor), the loss per row, and, when training, the
// gradient written over the logits in place: (softmax - onehot) * loss_mask[n] * grad_scale.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void cross_entropy_fused_bf16(float* losses, bf16* logits, const int32_t* targets, const float* loss_mask, float grad_scale, int64_t N,
                              int64_t V, bool write_grad, cudaStream_t stream);

// acc[0] += weight * sum_n losses[n] * mask[n] (one block, fixed order: deterministic).
void masked_loss_sum(float* acc, const float* losses, const float* mask, int64_t N, float weight, cudaStream_t stream);

}  // namespace mt::cuda
