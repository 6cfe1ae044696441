// optimizer.h: Adam with decoupled weight decay (Megatron's default) or SGD with momentum over the
// flat parameter buffer, fp32 master weights when the model computes in bf16/fp16, and the global
// gradient norm with clipping, each parameter counted once across TP.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"
#include "tensor/tensor.h"

namespace mt {

struct StepResult {
  double grad_norm = 0;  // before clipping, of the unscaled gradients
  bool skipped = false;  // non-finite gradients (fp16 overflow or NaN): no update
};

class Optimizer {
 public:
  Optimizer(const Config& cfg, ParamStore& params, ProcessGroups groups);
  // Unscales by 1/loss_scale, measures and clips the gradients, updates with `lr`.
  StepResult step(double lr, float loss_scale);
  // Rounds the working weights to the compute precision (bf16/fp16), from the fp32 master copy.
  void sync_working_weights();
  int64_t iterations() const { return t_; }
  size_t state_bytes() const;

 private:
  double grad_norm_sq();
  ParamStore& params_;
  ProcessGroups groups_;
  std::string kind_;
  double beta1_, beta2_, eps_, wd_, momentum_, clip_;
  bool bf16_, fp16_;
  Tensor master_, m_, v_;
  int64_t t_ = 0;
};

}  // namespace mt
