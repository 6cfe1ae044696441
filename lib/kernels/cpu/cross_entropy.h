// cross_entropy.h: softmax cross-entropy over the (padded) vocabulary in fp32, forward and backward.
#pragma once
#include <cstdint>

namespace mt::cpu {

// losses[n] = logsumexp(logits[n]) - logits[n][target[n]]; lse saved for backward.
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V);
// dlogits[n] = (softmax(logits[n]) - onehot(target[n])) * dloss[n]; dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                            const float* dloss, int64_t N, int64_t V);

}  // namespace mt::cpu
