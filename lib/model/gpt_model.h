// gpt_model.h: one pipeline stage of the GPT / LLaMA decoder on the CPU reference engine, for one rank's TP
// shard: its model chunks (one, or one per virtual stage under interleaving), each the layers [first, end) of
// the shared layout (model/layout.h), the embedding in the first virtual stage, the final norm, output layer
// and loss in the last; a stage holding every layer is the whole model. Every chunk's parameters sit in one
// ParamStore. Explicit
// forward and backward per unit (model/cpu/units.h), no autograd tape; each microbatch's activations are
// stashed under its id, so several can be in flight, and the weight-gradient GEMMs can run apart from the
// input-gradient ones (backward_weights).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/cpu/pass_context.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/model_dims.h"
#include "model/params.h"

namespace mt {
namespace cpu {
struct MoeOptions;
}

class GPTModel {
 public:
  using Activations = std::vector<float>;  // this rank's residual-stream tokens of a microbatch, [Tl, h]

  // The stage of pipeline rank groups.pp->rank() (every layer at PP 1).
  GPTModel(const Config& cfg, ProcessGroups groups);
  ~GPTModel();

  ParamStore& params() { return params_; }
  const ModelDims& dims() const { return dims_; }
  // The model chunks of this stage (virtual pipeline stages chunk x PP + rank) and where each one's
  // parameters sit.
  int64_t chunks() const { return static_cast<int64_t>(layouts_.size()); }
  const ModelLayout& layout(int64_t chunk = 0) const { return layouts_.at(static_cast<size_t>(chunk)); }

  // The whole model (first and last stage at once), one microbatch (id 0) at a time.
  // Forward and loss (mean over unmasked tokens); keeps what backward needs. `step` keys dropout.
  float forward(const Microbatch& mb, int64_t step, bool training = true);
  // Backward of the last forward: gradients of (loss * scale) accumulate into params().grads().
  // `last_microbatch`: this backward completes the iteration's gradients, so the per-layer reductions
  // (sequence-parallel partial sums over TP) and the grads-ready hook run; earlier microbatches only
  // accumulate (the partial sums add up, one reduction at the end is exact).
  void backward(float scale, bool last_microbatch = true);

  // The stage, microbatch by id, one model chunk at a time. forward_stage: `input` is the previous virtual
  // stage's output (ignored on the first); returns the loss on the last virtual stage (0 elsewhere, where
  // `output` receives the activations). A forward of an id already stashed replaces it; a forward that is
  // not training keeps nothing (evaluation).
  float forward_stage(int64_t id, const Microbatch& mb, int64_t step, bool training, Activations input, Activations* output,
                      int64_t chunk = 0);
  // backward_stage: `output_grad` is the next stage's input gradient (ignored on the last stage, where the
  // loss gradient is `scale`); `input_grad` (not on the first stage) receives this stage's. With
  // defer_weight_grads the weight-gradient GEMMs, and everything that must follow them, wait for
  // backward_weights(id); else the stash is released here.
  // last_microbatch: the chunk's last backward of the iteration.
  void backward_stage(int64_t id, float scale, bool last_microbatch, Activations output_grad, Activations* input_grad,
                      bool defer_weight_grads = false, int64_t chunk = 0);
  // last: the chunk's last weight-gradient pass of the iteration (the reductions and the hook queued after the
  // weight gradients run in it; those of earlier microbatches are skipped, their sums adding up).
  void backward_weights(int64_t id, bool last, int64_t chunk = 0);
  // The elements of one microbatch's activations at a stage boundary (this rank's [Tl, h] rows) for
  // micro_batch_size sequences.
  int64_t boundary_elements(int64_t micro_batch_size) const {
    const int64_t T = micro_batch_size * dims_.S / dims_.cp;  // CP: this rank's share of the sequences
    return (dims_.sequence_parallel ? T / dims_.tp : T) * dims_.h;
  }
  // Microbatches forwarded whose backward (or deferred weight gradients) has not run yet.
  size_t in_flight() const { return stash_.size(); }

  // Called during backward whenever the gradients of every parameter of index >= `lowest` (registration
  // order) are final for this backward (data parallel launches its bucket reductions from here).
  void set_grads_ready_hook(std::function<void(size_t lowest)> hook) { grads_ready_ = std::move(hook); }
  // The MoE layers' statistics since the last call (losses, token counts; training forwards only).
  cpu::MoeStats take_moe_stats() { return std::exchange(moe_stats_, {}); }
  const cpu::MoeStats& moe_stats() const { return moe_stats_; }
  // Multi-token prediction: each module's mean loss over the training forwards since the last call (none without MTP), and
  // (set_mtp_in_evaluation) the evaluation forwards' too: tools that compare the modules' losses without training's dropout.
  std::vector<double> take_mtp_losses();
  void set_mtp_in_evaluation(bool on) { mtp_in_evaluation_ = on; }
  // --moe-router-enable-expert-bias, once per iteration after the backward (Megatron's finalize_model_grads):
  // each MoE layer's kept tokens per expert summed over TP x DP x CP, and bias += rate * sign(mean - count).
  // Collective over those groups; uses the statistics take_moe_stats() then returns.
  void update_expert_biases(double rate);
  // quantile_balancing: each MoE layer's qb_beta from the iteration's quantiles (Megatron's _update_router_qb_beta).
  // Collective over DP x CP.
  void update_quantile_biases(double ema);
  // FP8's delayed scaling state of this stage's FP8 layers (null without it: model/fp8_scaling.h); checkpoints
  // carry it.
  Fp8ScalingState* fp8_scaling() { return fp8_.get(); }

 private:
  struct Units;
  struct Record;
  ModelDims dims_;
  ProcessGroups groups_;
  uint64_t seed_;
  ParamStore params_;
  std::vector<ModelLayout> layouts_;         // per chunk
  std::vector<std::unique_ptr<Units>> units_;  // per chunk, over layouts_
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Record>> stash_;  // (chunk, microbatch id)
  std::vector<std::unique_ptr<Record>> spare_;  // released records, their buffers kept for the next microbatch
  std::function<void(size_t)> grads_ready_;
  std::unique_ptr<cpu::MoeOptions> moe_options_;
  cpu::MoeStats moe_stats_;
  std::shared_ptr<Communicator> kv_group_;  // the TP ranks sharing this rank's K/V (kv_rep > 1)
  std::unique_ptr<Fp8ScalingState> fp8_;
  std::vector<bool> fp8_weights_due_;  // per chunk: its next training forward is the iteration's first
  // The amax accumulators of kinds [first, last] reduced (max) over TP x DP x CP, then the update.
  void fp8_update(int first_kind, int last_kind);
  std::unique_ptr<Record> take_record();
  void release(std::pair<int64_t, int64_t> key);
  void layer_finished(Record& r, const LayerParams& layer) const;  // reductions and the hook after a layer's backward
  std::vector<const LayerParams*> all_layers() const;  // the decoder's layers and the multi-token prediction modules'
  // Multi-token prediction (--mtp-num-layers) on the last stage: its modules' forward after the model's output, and their
  // backward before the output's (gpt_model.cpp).
  void mtp_forward(Record& R, Units& units, int64_t step, bool training);
  bool mtp_in_evaluation_ = false;
  double sequence_tokens(const Microbatch& mb) const;
  Activations mtp_backward(Record& R, const ModelLayout& layout, Units& units, float scale);
  std::vector<double> mtp_losses_;  // each module's mean loss summed over the training forwards since the last take
  int64_t mtp_microbatches_ = 0;
};

}  // namespace mt
