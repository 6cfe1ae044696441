// optimizer_step.h (CUDA): the optimizer step without a host round trip. The gradient norm, the clip
// factor, the non-finite check, Adam's step count and bias corrections live in a device StepState that
// kernels read; the host looks at it only at log intervals. AdamW runs as one multi-tensor launch over a
// chunk table (each chunk inside one parameter, carrying its weight-decay flag) and writes the bf16
// working copy of every updated weight.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

struct StepState {
  float grad_sumsq;       // of the unscaled gradients, this step
  float grad_norm;
  float clip_coef;        // applied to the gradients
  int32_t skip;           // 1: non-finite loss or gradients, no update this step
  int32_t t;              // Adam steps taken
  float bc1, bc2;         // 1 - beta^t
  float loss;             // this iteration's loss (mean over microbatches)
  float loss_acc;         // accumulates over microbatches
  int32_t skipped_total;  // iterations skipped so far
  int32_t nonfinite_run;  // consecutive non-finite iterations
  int32_t max_nonfinite_run;  // the longest such run so far (the training loop counts runs from the per-iteration history)
  // fp16 loss scaling (Megatron's DynamicGradScaler, kept on the device): the scale the next step's loss
  // gradient is multiplied by, its trackers, and 1 / the scale this step's gradients carry.
  float loss_scale;
  int32_t hysteresis_left;
  int32_t clean_steps;
  float unscale;
  int32_t nan_total;  // skipped iterations that were not fp16 overflows (non-finite loss, or bf16 / fp32)
  float loss_tokens;  // this step's loss tokens over the data-parallel group (set_value, then summed over DP)
};

// How step_prepare treats the loss scale: bf16 / fp32 (fp16 false) use 1; fp16 reads StepState::loss_scale
// and, when dynamic, halves it once `hysteresis` overflows have been seen (then at every further one) and
// doubles it after `window` clean steps, restoring the hysteresis.
struct LossScaleRule {
  bool fp16 = false, dynamic = false;
  float min_scale = 1.0f;
  int32_t window = 1000, hysteresis = 2;
};

struct AdamChunk {
  int64_t start;
  int32_t len;
  int32_t decay;
  // Weight of this chunk's squares in the gradient norm: 1, or 1/n for a parameter every one of n
  // tensor-parallel ranks holds (the ranks' partial sums are then added up, counting it once).
  float norm_weight = 1.0f;
  // Index of `start` in the optimizer state (master weights, m, v), which the distributed optimizer keeps
  // for its shard only; -1: the same as start (state laid out like the parameters).
  int64_t state = -1;
  // 1: the chunk's parameter takes AdamMulti::decoupled_lr when that is >= 0 (--decoupled-lr).
  int32_t decoupled = 0;
};

constexpr int kNormPartials = 1024;
// partials[kNormPartials] of sum over the chunks of norm_weight * g^2 (unscaled by the loss scale:
// step_prepare applies it).
// x is indexed by the chunks' start (gradients), or by their state index when by_state (master weights).
void sumsq_partials(float* partials, const float* x, const AdamChunk* chunks, int64_t nchunks, bool by_state, cudaStream_t stream);
// *count += the sum over the chunks of norm_weight x (the gradient entries that are exactly 0), in double (each chunk's
// count an integer, its weight 1 / its holders as in the norm): --log-num-zeros-in-grad, Megatron's count_zeros_fp32.
void add_zero_count(double* count, const float* g, const AdamChunk* chunks, int64_t nchunks, cudaStream_t stream);
// partials[0] += value (a sum computed elsewhere, e.g. the offloaded master weights' on the CPU).
void add_to_first(float* partials, float value, cudaStream_t stream);
// partials[0] = NaN when *value is not finite: a rank's non-finite loss reaches every rank's skip decision
// through the partials' all-reduce (the distributed optimizer, where each rank's loss is its own).
void poison_if_nonfinite(float* partials, const float* value, cudaStream_t stream);
// From the partials and loss_acc: norm, clip, skip, t and the bias corrections; loss = loss_acc * loss_weight; loss_acc reset.
// loss_tokens_dp > 0 (the data-parallel size): loss_acc holds this rank's summed token losses, scaled by loss_tokens_dp
// / max(loss_tokens, 1) into its share of Megatron's reported loss (the sum over the global batch's loss tokens, once
// averaged over DP). grad_tokens_dp > 0 (--calculate-per-token-loss): the gradients are sums over the tokens (averaged
// over DP) and get the same scale, which makes them the global batch's sums over its loss tokens.
void step_prepare(StepState* s, const float* partials, float max_norm, float beta1, float beta2, float loss_weight, const LossScaleRule& rule,
                  cudaStream_t stream, float loss_tokens_dp = 0.0f, float grad_tokens_dp = 0.0f);
// *dst = value, in stream order (a value known on the host, without a host buffer that must outlive the copy).
void set_value(float* dst, float value, cudaStream_t stream);
// w (fp32 master), m and v are indexed by the chunks' state index; g and w16 by their start.
struct AdamMulti {
  float *w = nullptr, *m = nullptr, *v = nullptr;  // fp32 master weights and moments (indexed like the chunks' state)
  // --exp-avg-dtype / --exp-avg-sq-dtype bf16: the moment stored in bf16 here instead (m / v unused), computed in fp32
  bf16 *m16 = nullptr, *v16 = nullptr;
  bf16* w16 = nullptr;                             // the 16-bit working copy, of type `type`
  const float* g = nullptr;                        // the gradients
  const AdamChunk* chunks = nullptr;
  int64_t count = 0;                               // chunks
  const StepState* state = nullptr;
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float decoupled_lr = -1;  // the rate of the chunks marked decoupled, when >= 0 (--decoupled-lr)
  F16 type = F16::kBF16;
};
void adamw_multi(const AdamMulti& a, cudaStream_t stream);
// A bf16-stored Adam moment (--exp-avg-dtype / --exp-avg-sq-dtype bf16) to and from the fp32 arrays of checkpoints,
// synchronously through a host staging buffer: up, each value rounded to nearest even; down, exact.
void moment_to_device(bf16* dst, const float* src, int64_t n);
void moment_to_host(float* dst, const bf16* src, int64_t n);
void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);
void cast_from_bf16(float* out, const bf16* in, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);

}  // namespace mt::cuda
