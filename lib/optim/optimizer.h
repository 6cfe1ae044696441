// optimizer.h: Adam with decoupled weight decay (Megatron's default) or SGD with momentum over the
// flat parameter buffer: fp32 master weights when the model computes in bf16/fp16, the global
// gradient norm with clipping (each parameter counted once across TP, PP and optimizer shards), and,
// with the distributed optimizer, state only for the ranges this DP rank owns.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"
#include "tensor/tensor.h"

namespace mt {

struct StepResult {
  double grad_norm = 0;  // before clipping, of the unscaled gradients
  bool skipped = false;  // non-finite gradients (fp16 overflow or NaN): no update
  // --log-num-zeros-in-grad: the gradient's entries that are exactly 0, each parameter counted once (Megatron's
  // count_zeros_fp32); -1 when not counted (the flag unset, or a skipped step, where Megatron has none).
  double num_zeros = -1;
};

using FlatRanges = std::vector<std::pair<int64_t, int64_t>>;

// Megatron's is_embedding_or_output_parameter: the word embeddings and the output layer's weight (not the learned
// positions), which --decoupled-lr gives a rate of their own (both engines).
bool takes_decoupled_lr(const std::string& name);

class Optimizer {
 public:
  // owned: flat ranges this rank updates (all of them without the distributed optimizer); sharded:
  // whether other DP ranks own the rest (norms then sum over the DP group).
  Optimizer(const Config& cfg, ParamStore& params, ProcessGroups groups, FlatRanges owned, bool sharded);
  Optimizer(const Config& cfg, ParamStore& params, ProcessGroups groups)
      : Optimizer(cfg, params, groups, FlatRanges{{0, params.numel()}}, false) {}
  // Unscales by 1/loss_scale, measures and clips the gradients, updates the owned ranges with `lr` (the input
  // embedding's and output layer's weights with decoupled_lr when it is >= 0: --decoupled-lr).
  StepResult step(double lr, float loss_scale, double decoupled_lr = -1);
  // L2 norm of all parameters, each counted once (for --log-params-norm).
  double params_norm();
  int64_t iterations() const { return t_; }
  size_t state_bytes() const;

  // State access for checkpoints: each segment is a flat range of one parameter this rank updates.
  struct Segment {
    size_t param;
    int64_t begin, end;  // flat range
    int64_t state;       // index of `begin` in the state buffers
  };
  const std::vector<Segment>& segments() const { return segments_; }
  // The segments (and their state offsets: the ranges back to back in order, each laid out like the flat buffers) of `owned` over the parameters:
  // the state layout every optimizer over those ranges uses (the CUDA engine's device state included).
  static std::vector<Segment> make_segments(const ParamStore& params, FlatRanges owned);
  float* master() { return master_.defined() ? master_.f32() : nullptr; }  // null in fp32 training
  float* exp_avg() { return m_.f32(); }                                      // Adam m / SGD momentum
  float* exp_avg_sq() { return v_.defined() ? v_.f32() : nullptr; }           // null with SGD
  void set_iterations(int64_t t) { t_ = t; }
  // After loading master weights: the working copy is their bf16/fp16 rounding.
  void refresh_working_weights();
  // After loading the moments: each rounded to its storage type (--exp-avg-dtype / --exp-avg-sq-dtype bf16).
  void round_stored_moments();
  // A master weight's working copy: its bf16 / fp16 rounding (itself in fp32 training).
  float to_working(float x) const;

 private:
  // The sum over this rank's owned entries of term(x), each parameter counted once, summed over the ranks.
  template <typename Term>
  double owned_sum(const float* buf, bool master, Term term);
  double owned_sum_sq(const float* buf, bool master);
  void round_to_working(const Segment& s);
  ParamStore& params_;
  ProcessGroups groups_;
  bool sharded_;
  std::vector<Segment> segments_;
  std::string kind_;
  double beta1_, beta2_, eps_, wd_, momentum_, clip_;
  bool bf16_, fp16_;
  bool count_zeros_;  // --log-num-zeros-in-grad
  // Megatron's precision-aware optimizer: Adam's moments stored in bf16 (here fp32 arrays holding bf16 values: each
  // step computes in fp32 from them and stores its result rounded to nearest even, as Transformer Engine's FusedAdam).
  bool exp_avg_bf16_, exp_avg_sq_bf16_;
  bool experts_;  // an MoE model: expert parameters' sums over the expert grid (on every stage alike)
  Tensor master_, m_, v_;
  int64_t t_ = 0;
};

}  // namespace mt
