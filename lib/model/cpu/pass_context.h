// pass_context.h: what every CPU unit sees while it runs one microbatch's forward or backward: the sizes,
// the parameters, the TP group, the microbatch and its dropout keys, and where weight-gradient work goes
// (at once, or queued for the stage's backward_weights: the B / W split of zero-bubble schedules).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "comm/communicator.h"
#include "model/fp8_scaling.h"
#include "model/model_dims.h"
#include "model/params.h"

namespace mt::cpu {

using Buf = std::vector<float>;
inline size_t sz(int64_t n) { return static_cast<size_t>(n); }
// Work that only accumulates parameter gradients (or finalises them), in the order it was queued.
using WeightGradQueue = std::vector<std::function<void()>>;

// One MoE layer's statistics over an iteration's microbatches (summed): the load-balancing loss (without its
// coefficient, over the TP group's tokens) and the z-loss (mean lse^2 over them), the tokens each expert kept on
// this rank, the choices routed and dropped; global_aux_loss's running token counts.
struct MoeLayerStats {
  double aux[3] = {0, 0, 0};  // the load-balancing losses by type (config.h's kAuxLossTypes), without their coefficients
  double z = 0;
  int64_t microbatches = 0;
  std::vector<double> tokens;
  double routed = 0, dropped = 0;
  std::vector<double> global_counts;
  int64_t global_steps = 0;
  // quantile_balancing: the microbatches' column quantiles summed (Megatron's qb_beta_accum) and their count.
  std::vector<double> quantile_sum;
  int64_t quantile_count = 0;
  // A digest of the routing: over every (token, expert) choice, a hash of the token's global sample and position,
  // the expert and whether it was kept, summed (exactly, below 2^53): equal digests over the ranks of a layout
  // mean the same choices and the same drops.
  double routing_digest = 0;
};
using MoeStats = std::map<int64_t, MoeLayerStats>;  // by global layer index

struct PassContext {
  const ModelDims& D;
  ParamStore& params;
  const ProcessGroups& groups;
  uint64_t seed;
  const Microbatch& mb;
  int64_t step;
  bool training;
  int64_t T, Tl, t0;  // the microbatch's tokens; this rank's residual-stream tokens [t0, t0 + Tl) (SP: a shard)
  bool finishing = true;              // backward: the iteration's last microbatch (reductions and hooks run)
  float loss_grad_scale = 1;          // backward: the lm loss's gradient scale, which the MoE auxiliary losses share
  MoeStats* moe_stats = nullptr;      // training forward: where MoE layers add their losses and token counts
  WeightGradQueue* deferred = nullptr;  // backward: null runs weight-gradient work at once
  // FP8's delayed scaling (null: tensorwise, or no FP8): the stage's scales and amax accumulators; whether this pass
  // records amaxes (a training forward, every backward) and whether it casts the weights (the first training
  // microbatch of the iteration: later ones reuse that cast's scale, model/fp8_scaling.h).
  Fp8ScalingState* fp8 = nullptr;
  bool fp8_record = false, fp8_cast_weights = false;

  PassContext(const ModelDims& dims, ParamStore& p, const ProcessGroups& g, uint64_t seed, const Microbatch& mb, int64_t step,
              bool training);

  float* P(size_t i) const { return params.param(i); }
  float* G(size_t i) const { return params.grad(i); }
  // Sequence parallelism: this rank's Tl tokens of all T (all-gather), and the TP partial sums of all T into
  // this rank's tokens (reduce-scatter); without SP a copy and an all-reduce.
  void gather_tokens(const float* local, float* full) const;
  void reduce_tokens(float* full_partial, float* local) const;
  // Hidden dropout on this rank's tokens: the mask of a token depends on its global sample and position only.
  void dropout_tokens(float* x, int64_t layer, int site, bool backward) const;
  // The configured norm over n rows of `width` (the hidden size, or a head's for --qk-layernorm).
  void norm_forward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t n, int64_t width) const;
  const float* norm_scale(size_t w, int64_t width, std::vector<float>& buf) const;
  void norm_backward(float* dx, const float* dout, const float* x, const float* mean, const float* rstd, size_t w, size_t b, int64_t n,
                     int64_t width) const;
  // Under SP every rank sees only its tokens, so the gradients of parameters replicated over TP (norms,
  // row-parallel biases, positions) among [first, last) are partial sums: summed over TP at the iteration's
  // last backward (accumulated partial sums add up, one reduction at the end is exact).
  void sum_replicated_grads(size_t first, size_t last) const;
  // Weight-gradient work reading the n values of dy: now, or queued with a copy of dy.
  void weight_grad(const float* dy, int64_t n, std::function<void(const float* dy)> work) const;
  // Work that must follow the weight gradients queued so far (their reductions, the grads-ready hook).
  void after_weight_grads(std::function<void()> work) const;
};

}  // namespace mt::cpu
