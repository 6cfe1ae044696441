// cross_entropy.h (CUDA): softmax cross-entropy over a vocabulary shard, fp32, one block per row;
// backward writes the gradient over the logits (no second logits-sized buffer).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

// Single shard (TP 1): losses[n] and lse[n] from logits [N, V].
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           cudaStream_t stream);
// dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, const float* dloss,
                            int64_t N, int64_t V, cudaStream_t stream);

}  // namespace mt::cuda
