// optimizer.cpp: AdamW / SGD on flat buffers.
#include "optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "tensor/dtype.h"

namespace mt {

Optimizer::Optimizer(const Config& c, ParamStore& params, ProcessGroups groups)
    : params_(params),
      groups_(std::move(groups)),
      kind_(c.training.optimizer),
      beta1_(c.training.adam_beta1),
      beta2_(c.training.adam_beta2),
      eps_(c.training.adam_eps),
      wd_(c.training.weight_decay),
      momentum_(c.training.sgd_momentum),
      clip_(c.training.clip_grad),
      bf16_(c.precision.bf16),
      fp16_(c.precision.fp16) {
  const int64_t n = params_.numel();
  m_ = Tensor::zeros({n});
  if (kind_ == "adam") v_ = Tensor::zeros({n});
  if (bf16_ || fp16_) {
    master_ = Tensor::zeros({n});
    std::memcpy(master_.raw(), params_.params().raw(), static_cast<size_t>(n) * sizeof(float));
    sync_working_weights();
  }
}

size_t Optimizer::state_bytes() const {
  return m_.nbytes() + (v_.defined() ? v_.nbytes() : 0) + (master_.defined() ? master_.nbytes() : 0);
}

void Optimizer::sync_working_weights() {
  if (!master_.defined()) return;
  const float* src = master_.f32();
  float* dst = params_.params().f32();
  const int64_t n = params_.numel();
  if (bf16_) {
    for (int64_t i = 0; i < n; ++i) dst[i] = round_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = round_fp16(src[i]);
  }
}

double Optimizer::grad_norm_sq() {
  // Parameters replicated over TP (norms, row-parallel biases) are counted on TP rank 0 only.
  const bool tp_lead = groups_.tp->rank() == 0;
  double sq = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& p = params_.info(i);
    if (p.shard_dim < 0 && !tp_lead) continue;
    const float* g = params_.grad(i);
    for (int64_t e = 0; e < p.numel; ++e) sq += static_cast<double>(g[e]) * g[e];
  }
  groups_.tp->all_reduce(&sq, 1, ReduceOp::kSum);
  groups_.pp->all_reduce(&sq, 1, ReduceOp::kSum);
  return sq;
}

StepResult Optimizer::step(double lr, float loss_scale) {
  StepResult r;
  float* g = params_.grads().f32();
  const int64_t n = params_.numel();
  if (loss_scale != 1.0f) {
    const float inv = 1.0f / loss_scale;
    for (int64_t i = 0; i < n; ++i) g[i] *= inv;
  }
  r.grad_norm = std::sqrt(grad_norm_sq());
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  if (clip_ > 0 && r.grad_norm > clip_) {
    const float c = static_cast<float>(clip_ / (r.grad_norm + 1e-6));
    for (int64_t i = 0; i < n; ++i) g[i] *= c;
  }
  ++t_;
  float* w = master_.defined() ? master_.f32() : params_.params().f32();
  float* m = m_.f32();
  const float lrf = static_cast<float>(lr);
  if (kind_ == "adam") {
    float* v = v_.f32();
    const float b1 = static_cast<float>(beta1_), b2 = static_cast<float>(beta2_), eps = static_cast<float>(eps_);
    const float bc1 = static_cast<float>(1.0 - std::pow(beta1_, static_cast<double>(t_)));
    const float bc2 = static_cast<float>(1.0 - std::pow(beta2_, static_cast<double>(t_)));
    for (size_t pi = 0; pi < params_.size(); ++pi) {
      const ParamInfo& p = params_.info(pi);
      const float wd = p.weight_decay ? static_cast<float>(wd_) : 0.0f;
      for (int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        m[e] = b1 * m[e] + (1.0f - b1) * g[e];
        v[e] = b2 * v[e] + (1.0f - b2) * g[e] * g[e];
        const float update = (m[e] / bc1) / (std::sqrt(v[e] / bc2) + eps);
        w[e] -= lrf * (update + wd * w[e]);
      }
    }
  } else {
    const float mom = static_cast<float>(momentum_);
    for (size_t pi = 0; pi < params_.size(); ++pi) {
      const ParamInfo& p = params_.info(pi);
      const float wd = p.weight_decay ? static_cast<float>(wd_) : 0.0f;
      for (int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        const float grad = g[e] + wd * w[e];
        m[e] = t_ == 1 ? grad : mom * m[e] + grad;
        w[e] -= lrf * m[e];
      }
    }
  }
  sync_working_weights();
  return r;
}

}  // namespace mt
