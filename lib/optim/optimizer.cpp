// optimizer.cpp: AdamW / SGD on the owned ranges of the flat buffers.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "config/optimizer_state.h"
#include "tensor/dtype.h"

namespace mt {

Optimizer::Optimizer(const Config& c, ParamStore& params, ProcessGroups groups, FlatRanges owned, bool sharded)
    : params_(params),
      groups_(std::move(groups)),
      sharded_(sharded),
      kind_(c.training.optimizer),
      beta1_(c.training.adam_beta1),
      beta2_(c.training.adam_beta2),
      eps_(c.training.adam_eps),
      wd_(c.training.weight_decay),
      momentum_(c.training.sgd_momentum),
      clip_(c.training.clip_grad),
      bf16_(c.precision.bf16),
      fp16_(c.precision.fp16),
      count_zeros_(c.logging.log_num_zeros_in_grad),
      exp_avg_bf16_(exp_avg_in_bf16(c)),
      exp_avg_sq_bf16_(exp_avg_sq_in_bf16(c)),
      experts_(c.moe.num_experts.has_value()) {
  segments_ = make_segments(params_, std::move(owned));
  const int64_t state = segments_.empty() ? 0 : segments_.back().state + (segments_.back().end - segments_.back().begin);
  m_ = Tensor::zeros({state});
  if (kind_ == "adam") v_ = Tensor::zeros({state});
  if (bf16_ || fp16_) {
    master_ = Tensor::zeros({state});
    const float* w = params_.params().f32();
    for (const auto& s : segments_) {
      std::memcpy(master_.f32() + s.state, w + s.begin, static_cast<size_t>(s.end - s.begin) * sizeof(float));
      round_to_working(s);
    }
  }
}

std::vector<Optimizer::Segment> Optimizer::make_segments(const ParamStore& params, FlatRanges owned) {
  std::vector<Segment> out;
  int64_t state = 0;
  std::sort(owned.begin(), owned.end());
  // In flat order (the expert parameters sit after the dense ones, whatever their registration order), so the
  // state of an unsharded optimizer lies like the parameters.
  std::vector<size_t> by_offset(params.size());
  for (size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::stable_sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return params.info(a).offset < params.info(b).offset; });
  // Each owned range's state lies like the range, the alignment gaps between parameters (ParamStore::allocate)
  // included: without sharding the state index is the flat offset, as the CUDA engine's buffers have it.
  for (const auto& [lo, hi] : owned) {
    for (size_t i : by_offset) {
      const ParamInfo& p = params.info(i);
      if (!p.trainable) continue;
      const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
      if (b >= e) continue;
      out.push_back({i, b, e, state + (b - lo)});
    }
    state += hi - lo;
  }
  return out;
}

void Optimizer::refresh_working_weights() {
  for (const auto& s : segments_) round_to_working(s);
}

void Optimizer::round_stored_moments() {
  const int64_t n = m_.numel();
  if (exp_avg_bf16_) {
    float* m = m_.f32();
    for (int64_t i = 0; i < n; ++i) m[i] = round_bf16(m[i]);
  }
  if (exp_avg_sq_bf16_ && v_.defined()) {
    float* v = v_.f32();
    for (int64_t i = 0; i < n; ++i) v[i] = round_bf16(v[i]);
  }
}

size_t Optimizer::state_bytes() const {
  return m_.nbytes() + (v_.defined() ? v_.nbytes() : 0) + (master_.defined() ? master_.nbytes() : 0);
}

float Optimizer::to_working(float x) const {
  if (!master_.defined()) return x;
  return bf16_ ? round_bf16(x) : round_fp16(x);
}

void Optimizer::round_to_working(const Segment& s) {
  if (!master_.defined()) return;
  const float* src = master_.f32() + s.state;
  float* dst = params_.params().f32() + s.begin;
  const int64_t n = s.end - s.begin;
  if (bf16_) {
    for (int64_t i = 0; i < n; ++i) dst[i] = round_bf16(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = round_fp16(src[i]);
  }
}

template <typename Term>
double Optimizer::owned_sum(const float* buf, bool master, Term term) {
  // Each parameter counted once. Dense: those replicated over TP (norms, row-parallel biases, the router) on TP
  // rank 0 only, replicated shards (K/V replication) on their first holder only, the tied embedding once (on the
  // first stage); summed over TP and PP (and DP x CP when the optimizer is sharded). Experts (Megatron's expert
  // norm): those whole on every expert-TP rank on its first only; summed over expert-TP, EP and PP (and
  // expert-DP when sharded).
  const bool tp_lead = groups_.tp->rank() == 0, etp_lead = groups_.expert_tp->rank() == 0;
  double sq[2] = {0, 0};
  for (const auto& s : segments_) {
    const ParamInfo& p = params_.info(s.param);
    const bool expert = p.grad_group == GradGroup::kExpert;
    if (expert ? (p.shard_dim < 0 && !etp_lead) : (p.shard_dim < 0 && !tp_lead)) continue;
    if (p.replica > 0) continue;  // K/V replication: counted on the group's first rank
    if (p.tied_copy) continue;    // the tied embedding's last-stage copy: counted on the first stage
    const float* x = master ? buf + s.state : buf + s.begin;
    double& into = sq[expert ? 1 : 0];
    for (int64_t i = 0; i < s.end - s.begin; ++i) into += term(x[i]);
  }
  groups_.tp->all_reduce(&sq[0], 1, ReduceOp::kSum);
  groups_.pp->all_reduce(sq, 2, ReduceOp::kSum);
  if (sharded_) groups_.dp_cp->all_reduce(&sq[0], 1, ReduceOp::kSum);
  if (experts_) {
    groups_.expert_tp->all_reduce(&sq[1], 1, ReduceOp::kSum);
    groups_.ep->all_reduce(&sq[1], 1, ReduceOp::kSum);
    if (sharded_) groups_.expert_dp->all_reduce(&sq[1], 1, ReduceOp::kSum);
  }
  return sq[0] + sq[1];
}

double Optimizer::owned_sum_sq(const float* buf, bool master) {
  return owned_sum(buf, master, [](float x) { return static_cast<double>(x) * x; });
}

double Optimizer::params_norm() {
  if (master_.defined()) return std::sqrt(owned_sum_sq(master_.f32(), true));
  return std::sqrt(owned_sum_sq(params_.params().f32(), false));
}

bool takes_decoupled_lr(const std::string& name) { return name == "embedding.word_embeddings.weight" || name == "output_layer.weight"; }

StepResult Optimizer::step(double lr, float loss_scale, double decoupled_lr) {
  StepResult r;
  float* g = params_.grads().f32();
  if (loss_scale != 1.0f) {
    const float inv = 1.0f / loss_scale;
    for (const auto& s : segments_) {
      for (int64_t i = s.begin; i < s.end; ++i) g[i] *= inv;
    }
  }
  r.grad_norm = std::sqrt(owned_sum_sq(g, false));
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  // (Megatron logs the count as the fp32 value its max over the model-parallel group passes through)
  if (count_zeros_) r.num_zeros = static_cast<float>(owned_sum(g, false, [](float x) { return x == 0.0f ? 1.0 : 0.0; }));
  const float clip = (clip_ > 0 && r.grad_norm > clip_) ? static_cast<float>(clip_ / (r.grad_norm + 1e-6)) : 1.0f;
  ++t_;
  float* w = master_.defined() ? master_.f32() : params_.params().f32();
  float* m = m_.f32();
  const float lr_main = static_cast<float>(lr);
  const float b1 = static_cast<float>(beta1_), b2 = static_cast<float>(beta2_), eps = static_cast<float>(eps_);
  const float bc1 = static_cast<float>(1.0 - std::pow(beta1_, static_cast<double>(t_)));
  const float bc2 = static_cast<float>(1.0 - std::pow(beta2_, static_cast<double>(t_)));
  const float mom = static_cast<float>(momentum_);
  for (const auto& s : segments_) {
    const float wd = params_.info(s.param).weight_decay ? static_cast<float>(wd_) : 0.0f;
    const float lrf = decoupled_lr >= 0 && takes_decoupled_lr(params_.info(s.param).name) ? static_cast<float>(decoupled_lr) : lr_main;
    float* ws = master_.defined() ? w + s.state : w + s.begin;
    float* ms = m + s.state;
    const float* gs = g + s.begin;
    const int64_t n = s.end - s.begin;
    if (kind_ == "adam") {
      float* vs = v_.f32() + s.state;
      for (int64_t i = 0; i < n; ++i) {
        const float gi = gs[i] * clip;
        ms[i] = b1 * ms[i] + (1.0f - b1) * gi;
        vs[i] = b2 * vs[i] + (1.0f - b2) * gi * gi;
        const float update = (ms[i] / bc1) / (std::sqrt(vs[i] / bc2) + eps);
        ws[i] -= lrf * (update + wd * ws[i]);
      }
      // The moments' storage (the update above used them unrounded, as Transformer Engine's FusedAdam does)
      if (exp_avg_bf16_) {
        for (int64_t i = 0; i < n; ++i) ms[i] = round_bf16(ms[i]);
      }
      if (exp_avg_sq_bf16_) {
        for (int64_t i = 0; i < n; ++i) vs[i] = round_bf16(vs[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const float gi = gs[i] * clip + wd * ws[i];
        ms[i] = t_ == 1 ? gi : mom * ms[i] + gi;
        ws[i] -= lrf * ms[i];
      }
    }
    round_to_working(s);
  }
  return r;
}

}  // namespace mt
