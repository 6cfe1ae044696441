// cross_entropy_bf16.h (CUDA): fused softmax cross-entropy over 16-bit logits [N, V] (the whole vocabulary,
// TP 1): online max / sum in fp32 (no fp32 probability tensor), the loss per row, and, when training, the
// gradient written over the logits in place: (softmax - onehot) * loss_mask[n] * grad_scale * *loss_scale
// (fp16's loss scale, read on the device; nullptr: 1).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void cross_entropy_fused_bf16(float* losses, bf16* logits, const int32_t* targets, const float* loss_mask, float grad_scale, int64_t N,
                              int64_t V, bool write_grad, cudaStream_t stream, F16 t = F16::kBF16, const float* loss_scale = nullptr);

// Vocabulary-parallel cross-entropy (TP > 1, no rank holds full-vocabulary logits): this rank's logits
// [N, V_local] are the columns [v0, v0 + V_local). Three kernels around two collectives over TP:
//   ce_shard_stats    stats[4N] = { row max | local max | local sum of exp(x - local max) | target logit or 0 }
//   (all-reduce MAX of stats[0, N))
//   ce_shard_rescale  local sums rescaled to the global max
//   (all-reduce SUM of stats[2N, 4N): the softmax denominator and the target logit)
//   ce_shard_finish   losses[n] = log(sum) + max - target; when training, the gradient in place as above.
void ce_shard_stats(float* stats, const bf16* logits, const int32_t* targets, int64_t N, int64_t V_local, int64_t v0, cudaStream_t stream,
                    F16 t = F16::kBF16);
void ce_shard_rescale(float* stats, int64_t N, cudaStream_t stream);
struct CeShardFinish {
  float* losses = nullptr;  // [rows]
  bf16* logits = nullptr;   // [rows, vocab_local]; the gradient written in place when write_grad
  const float* stats = nullptr;
  const int32_t* targets = nullptr;
  const float* loss_mask = nullptr;
  float grad_scale = 0;
  int64_t rows = 0, vocab_local = 0, vocab_start = 0;
  bool write_grad = false;
  F16 type = F16::kBF16;
  const float* loss_scale = nullptr;  // fp16: the device-side loss scale the gradient is multiplied by
};
void ce_shard_finish(const CeShardFinish& a, cudaStream_t stream);

// acc[0] += weight * sum_n losses[n] * mask[n] (one block, fixed order: deterministic).
void masked_loss_sum(float* acc, const float* losses, const float* mask, int64_t N, float weight, cudaStream_t stream);

}  // namespace mt::cuda
