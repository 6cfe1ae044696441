// cross_entropy.h: softmax cross-entropy over the (padded) vocabulary in fp32, forward and backward.
// Vocab-parallel: each rank holds logits for vocab rows [vocab_start, vocab_start + V_local); the row
// max, the sum of exponentials and the target logit are combined across ranks through `reduce`, so no
// rank ever holds full-vocabulary logits.
#pragma once
#include <cstdint>
#include <functional>

namespace mt::cpu {

struct VocabReduce {
  std::function<void(float*, int64_t)> max;  // element-wise all-reduce max over the vocab shards
  std::function<void(float*, int64_t)> sum;  // element-wise all-reduce sum
};

// losses[n] = logsumexp(logits[n]) - logits[n][target[n]]; lse saved for backward.
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V_local,
                           int64_t vocab_start = 0, const VocabReduce* reduce = nullptr);
// dlogits[n] = (softmax(logits[n]) - onehot(target[n])) * dloss[n]; dlogits may alias logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets,
                            const float* dloss, int64_t N, int64_t V_local, int64_t vocab_start = 0);

}  // namespace mt::cpu
