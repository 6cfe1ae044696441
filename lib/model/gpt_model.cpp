// gpt_model.cpp: parameters, forward and backward of the decoder on the CPU reference kernels.
#include "model/gpt_model.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "config/resolve.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tensor/rng.h"

namespace mt {

using Buf = std::vector<float>;

ModelDims model_dims(const Config& c, int64_t tp_rank, int64_t tp) {
  ModelDims d{};
  d.L = *c.model.num_layers;
  d.h = *c.model.hidden_size;
  d.nh = *c.model.num_attention_heads;
  d.ng = effective_query_groups(c);
  d.d = c.model.kv_channels.value_or(d.h / d.nh);
  d.F = c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(d.h, c.model.swiglu));
  d.V = c.derived.padded_vocab_size;
  d.S = *c.data.seq_length;
  d.max_pos = c.model.max_position_embeddings.value_or(d.S);
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.nh_local = d.nh / tp;
  d.ng_local = std::max<int64_t>(1, d.ng / tp);
  d.kv_rep = d.ng < tp ? tp / d.ng : 1;
  d.qh_local = d.ng_local * (d.nh / d.ng);
  d.F_local = d.F / tp;
  d.V_local = d.V / tp;
  d.rms = c.model.normalization == "RMSNorm";
  d.swiglu = c.model.swiglu;
  d.bias = !c.model.disable_bias_linear;
  d.rope = c.model.position_embedding_type == "rope";
  d.learned_pos = c.model.position_embedding_type == "learned_absolute";
  d.tied = !c.model.untie_embeddings_and_output_weights;
  d.sequence_parallel = c.parallel.sequence_parallel && tp > 1;
  d.qk_norm = c.model.qk_layernorm;
  d.eps = static_cast<float>(c.model.norm_epsilon);
  d.rope_base = static_cast<float>(c.model.rotary_base);
  d.hidden_dropout = static_cast<float>(c.model.hidden_dropout);
  d.attention_dropout = static_cast<float>(c.model.attention_dropout);
  // Query-key layer scaling divides the scores by the layer number and the softmax multiplies it back:
  // identical in fp32 math, so the reference applies the plain 1/sqrt(d).
  d.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d.d));
  d.rot_dim = static_cast<int64_t>(static_cast<double>(d.d) * c.model.rotary_percent);
  d.rot_dim -= d.rot_dim % 2;
  return d;
}

struct GPTModel::Layer {
  size_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  size_t qn_w, qn_b, kn_w, kn_b;  // --qk-layernorm (the biases with LayerNorm only)
};

// Activations of one microbatch kept for backward.
// Token-sharded tensors (x, norms, x2) hold the local Tl tokens; *_full ones all T (gathered under SP).
struct GPTModel::Record {
  struct L {
    Buf x, ln1, ln1_full, mean1, rstd1, q, k, v, probs, ctx, x2, ln2, ln2_full, mean2, rstd2, fc1, act;
    Buf q_in, k_in, q_mean, q_rstd, k_mean, k_rstd;  // --qk-layernorm: the heads before their norm, its statistics
  };
  std::vector<L> layers;
  Buf x_final, lnf, lnf_full, meanf, rstdf, logits, lse, losses;
  Microbatch mb;
  int64_t step = 0;
  float denom = 1;
  bool training = true;
};

namespace {

ParamInfo make_param(const std::string& name, std::vector<int64_t> global, int shard_dim, int64_t rank, int64_t count,
                     InitKind init, float std) {
  ParamInfo p;
  p.name = name;
  p.global_shape = global;
  p.local_shape = global;
  if (shard_dim >= 0 && count > 1) p.local_shape[static_cast<size_t>(shard_dim)] /= count;
  p.shard_dim = shard_dim;
  p.shard_rank = rank;
  p.shard_count = count;
  p.init = init;
  p.init_std = std;
  p.weight_decay = global.size() > 1;  // Megatron: no decay on biases and norm weights
  return p;
}

}  // namespace

uint64_t dropout_key(uint64_t seed, int64_t step, int64_t sample, int64_t layer, int site) {
  const std::string k = std::to_string(step) + "/" + std::to_string(sample) + "/" + std::to_string(layer) + "/" +
                        std::to_string(site);
  return rng_key(seed, k);
}

GPTModel::GPTModel(const Config& cfg, ProcessGroups groups)
    : dims_(model_dims(cfg, groups.tp->rank(), groups.tp->size())),
      groups_(std::move(groups)),
      seed_(static_cast<uint64_t>(cfg.training.seed)),
      rec_(std::make_unique<Record>()) {
  const ModelDims& D = dims_;
  const float std = static_cast<float>(cfg.model.init_method_std);
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(D.L));
  const int64_t r = D.tp_rank, t = D.tp;
  // K/V replication (query groups below TP, as Megatron): the QKV weight is split into whole groups over
  // the ng groups of kv_rep ranks each; ranks of a group hold the same shard (replica > 0 for all but one).
  if (D.kv_rep > 1) {
    kv_group_ = groups_.tp->sub_group(static_cast<int>(r / D.kv_rep), static_cast<int>(r), "kv-replica");
  }
  auto qkv_param = [&](const std::string& name, std::vector<int64_t> shape, InitKind init, float sd) {
    ParamInfo p = make_param(name, std::move(shape), 0, r / D.kv_rep, t / D.kv_rep, init, sd);
    p.replica = r % D.kv_rep;
    return params_.add(p);
  };
  wte_ = params_.add(make_param("embedding.word_embeddings.weight", {D.V, D.h}, 0, r, t, InitKind::kNormal, std));
  if (D.learned_pos) {
    wpe_ = params_.add(make_param("embedding.position_embeddings.weight", {D.max_pos, D.h}, -1, r, t, InitKind::kNormal, std));
  }
  const int64_t qkv_rows = D.ng * (D.nh / D.ng + 2) * D.d;
  for (int64_t l = 0; l < D.L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer ly{};
    ly.ln1_w = params_.add(make_param(p + "input_norm.weight", {D.h}, -1, r, t, InitKind::kOnes, 0));
    if (!D.rms) ly.ln1_b = params_.add(make_param(p + "input_norm.bias", {D.h}, -1, r, t, InitKind::kZeros, 0));
    ly.qkv_w = qkv_param(p + "attention.qkv.weight", {qkv_rows, D.h}, InitKind::kNormal, std);
    if (D.bias) ly.qkv_b = qkv_param(p + "attention.qkv.bias", {qkv_rows}, InitKind::kZeros, 0);
    if (D.qk_norm) {  // one [d] weight shared by every query head (and one by every key head), on every TP rank
      ly.qn_w = params_.add(make_param(p + "attention.q_norm.weight", {D.d}, -1, r, t, InitKind::kOnes, 0));
      if (!D.rms) ly.qn_b = params_.add(make_param(p + "attention.q_norm.bias", {D.d}, -1, r, t, InitKind::kZeros, 0));
      ly.kn_w = params_.add(make_param(p + "attention.k_norm.weight", {D.d}, -1, r, t, InitKind::kOnes, 0));
      if (!D.rms) ly.kn_b = params_.add(make_param(p + "attention.k_norm.bias", {D.d}, -1, r, t, InitKind::kZeros, 0));
    }
    ly.proj_w = params_.add(make_param(p + "attention.proj.weight", {D.h, D.nh * D.d}, 1, r, t, InitKind::kNormal, out_std));
    if (D.bias) ly.proj_b = params_.add(make_param(p + "attention.proj.bias", {D.h}, -1, r, t, InitKind::kZeros, 0));
    ly.ln2_w = params_.add(make_param(p + "mlp_norm.weight", {D.h}, -1, r, t, InitKind::kOnes, 0));
    if (!D.rms) ly.ln2_b = params_.add(make_param(p + "mlp_norm.bias", {D.h}, -1, r, t, InitKind::kZeros, 0));
    // With SwiGLU the gate and up projections are separate global tensors whose shards sit side by
    // side, so the local fc1 is one [2F/tp, h] GEMM.
    if (D.swiglu) {
      ly.fc1_w = params_.add(make_param(p + "mlp.fc1_gate.weight", {D.F, D.h}, 0, r, t, InitKind::kNormal, std));
      params_.add(make_param(p + "mlp.fc1_up.weight", {D.F, D.h}, 0, r, t, InitKind::kNormal, std));
      if (D.bias) {
        ly.fc1_b = params_.add(make_param(p + "mlp.fc1_gate.bias", {D.F}, 0, r, t, InitKind::kZeros, 0));
        params_.add(make_param(p + "mlp.fc1_up.bias", {D.F}, 0, r, t, InitKind::kZeros, 0));
      }
    } else {
      ly.fc1_w = params_.add(make_param(p + "mlp.fc1.weight", {D.F, D.h}, 0, r, t, InitKind::kNormal, std));
      if (D.bias) ly.fc1_b = params_.add(make_param(p + "mlp.fc1.bias", {D.F}, 0, r, t, InitKind::kZeros, 0));
    }
    ly.fc2_w = params_.add(make_param(p + "mlp.fc2.weight", {D.h, D.F}, 1, r, t, InitKind::kNormal, out_std));
    if (D.bias) ly.fc2_b = params_.add(make_param(p + "mlp.fc2.bias", {D.h}, -1, r, t, InitKind::kZeros, 0));
    layers_.push_back(ly);
  }
  final_w_ = params_.add(make_param("final_norm.weight", {D.h}, -1, r, t, InitKind::kOnes, 0));
  has_final_b_ = !D.rms;
  if (has_final_b_) final_b_ = params_.add(make_param("final_norm.bias", {D.h}, -1, r, t, InitKind::kZeros, 0));
  out_w_ = D.tied ? wte_ : params_.add(make_param("output_layer.weight", {D.V, D.h}, 0, r, t, InitKind::kNormal, std));
  params_.allocate();
  params_.initialize(seed_);
}

GPTModel::~GPTModel() = default;

void GPTModel::gather_tokens(const float* local, float* full, int64_t Tl) const {
  if (dims_.sequence_parallel) groups_.tp->all_gather(local, full, Tl * dims_.h);
  else if (local != full) std::memcpy(full, local, static_cast<size_t>(Tl * dims_.h) * sizeof(float));
}

void GPTModel::reduce_tokens(float* full_partial, float* local, int64_t Tl) const {
  if (dims_.sequence_parallel) {
    groups_.tp->reduce_scatter(full_partial, local, Tl * dims_.h, ReduceOp::kSum);
  } else {
    groups_.tp->all_reduce(full_partial, Tl * dims_.h, ReduceOp::kSum);
    if (local != full_partial) std::memcpy(local, full_partial, static_cast<size_t>(Tl * dims_.h) * sizeof(float));
  }
}

// Dropout on tokens [t0, t0 + n) of the microbatch; the mask of a token depends on its global sample
// and position only, so any DP or SP split draws the same one.
void GPTModel::dropout_tokens(float* x, int64_t t0, int64_t n, int64_t layer, int site, bool backward) const {
  const Record& R = *rec_;
  const float p = R.training ? dims_.hidden_dropout : 0.0f;
  if (p <= 0) return;
  const int64_t S = R.mb.S, h = dims_.h;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    const uint64_t key = dropout_key(seed_, R.step, R.mb.first_sample + t / S, layer, site);
    float* row = x + i * h;
    if (backward) cpu::dropout_backward(row, row, h, p, key, static_cast<uint64_t>((t % S) * h));
    else cpu::dropout_forward(row, row, h, p, key, static_cast<uint64_t>((t % S) * h));
  }
}

// Under SP every rank sees only its tokens, so the gradients of parameters replicated over TP (norms,
// row-parallel biases, positions) are partial sums: add them up over TP.
void GPTModel::all_reduce_replicated_grads(size_t first, size_t last) const {
  if (!dims_.sequence_parallel || !finishing_) return;
  for (size_t i = first; i < last; ++i) {
    const ParamInfo& p = params_.info(i);
    if (p.shard_dim < 0) groups_.tp->all_reduce(params_.grad(i), p.numel, ReduceOp::kSum);
  }
}

void GPTModel::norm_forward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t n) {
  if (dims_.rms) cpu::rmsnorm_forward(out, rstd, x, params_.param(w), n, dims_.h, dims_.eps);
  else cpu::layernorm_forward(out, mean, rstd, x, params_.param(w), params_.param(b), n, dims_.h, dims_.eps);
}

// --qk-layernorm: the configured norm over n rows of one head (width d).
void GPTModel::head_norm_forward(float* out, Buf& mean, Buf& rstd, const float* x, size_t w, size_t b, int64_t n) {
  const int64_t d = dims_.d;
  mean.resize(static_cast<size_t>(n));
  rstd.resize(static_cast<size_t>(n));
  if (dims_.rms) cpu::rmsnorm_forward(out, rstd.data(), x, params_.param(w), n, d, dims_.eps);
  else cpu::layernorm_forward(out, mean.data(), rstd.data(), x, params_.param(w), params_.param(b), n, d, dims_.eps);
}

void GPTModel::head_norm_backward(float* dx, const float* dout, const float* x, const Buf& mean, const Buf& rstd, size_t w, size_t b,
                                  int64_t n) {
  const int64_t d = dims_.d;
  if (dims_.rms) cpu::rmsnorm_backward(dx, params_.grad(w), dout, x, params_.param(w), rstd.data(), n, d);
  else cpu::layernorm_backward(dx, params_.grad(w), params_.grad(b), dout, x, params_.param(w), mean.data(), rstd.data(), n, d);
}

void GPTModel::norm_backward(float* dx, const float* dout, const float* x, const float* mean, const float* rstd, size_t w, size_t b,
                             int64_t n) {
  if (dims_.rms) cpu::rmsnorm_backward(dx, params_.grad(w), dout, x, params_.param(w), rstd, n, dims_.h);
  else cpu::layernorm_backward(dx, params_.grad(w), params_.grad(b), dout, x, params_.param(w), mean, rstd, n, dims_.h);
}

float GPTModel::forward(const Microbatch& mb, int64_t step, bool training) {
  const ModelDims& D = dims_;
  const int64_t B = mb.B, S = mb.S, T = B * S, h = D.h;
  if (S > D.max_pos) throw std::runtime_error("sequence longer than --max-position-embeddings");
  if (D.sequence_parallel && T % D.tp != 0) {
    throw std::runtime_error("sequence parallelism needs micro-batch-size x seq-length divisible by TP");
  }
  const int64_t Tl = D.sequence_parallel ? T / D.tp : T;
  const int64_t t0 = D.sequence_parallel ? D.tp_rank * Tl : 0;
  Record& R = *rec_;
  R.mb = mb;
  R.step = step;
  R.training = training;
  R.layers.resize(static_cast<size_t>(D.L));
  const float ad = training ? D.attention_dropout : 0.0f;
  const int64_t qkv_local = (D.qh_local + 2 * D.ng_local) * D.d;
  const int64_t fc1_out = D.F_local * (D.swiglu ? 2 : 1);
  auto P = [&](size_t i) { return params_.param(i); };
  auto sz = [](int64_t n) { return static_cast<size_t>(n); };

  // Embedding: vocab-parallel lookup summed over TP (scattered over tokens under SP), then positions.
  Buf full(sz(T * h)), x(sz(Tl * h));
  cpu::embedding_forward(full.data(), mb.tokens.data(), nullptr, P(wte_), nullptr, T, h, D.tp_rank * D.V_local, D.V_local);
  reduce_tokens(full.data(), x.data(), Tl);
  if (D.learned_pos) {
    const float* wpe = P(wpe_);
    for (int64_t i = 0; i < Tl; ++i) {
      const float* pr = wpe + static_cast<int64_t>(mb.positions[sz(t0 + i)]) * h;
      for (int64_t j = 0; j < h; ++j) x[sz(i * h + j)] += pr[j];
    }
  }
  dropout_tokens(x.data(), t0, Tl, -1, kDropEmbedding, false);

  for (int64_t l = 0; l < D.L; ++l) {
    const Layer& ly = layers_[sz(l)];
    auto& A = R.layers[sz(l)];
    A.x = std::move(x);
    A.ln1.resize(sz(Tl * h));
    A.mean1.resize(sz(Tl));
    A.rstd1.resize(sz(Tl));
    norm_forward(A.ln1.data(), A.mean1.data(), A.rstd1.data(), A.x.data(), ly.ln1_w, ly.ln1_b, Tl);
    A.ln1_full.resize(sz(T * h));
    gather_tokens(A.ln1.data(), A.ln1_full.data(), Tl);
    Buf qkv(sz(T * qkv_local));
    cpu::linear_forward(qkv.data(), A.ln1_full.data(), P(ly.qkv_w), D.bias ? P(ly.qkv_b) : nullptr, T, h, qkv_local);
    A.q.resize(sz(T * D.nh_local * D.d));
    A.k.resize(sz(T * D.ng_local * D.d));
    A.v.resize(sz(T * D.ng_local * D.d));
    if (D.kv_rep == 1) {
      cpu::qkv_split(A.q.data(), A.k.data(), A.v.data(), qkv.data(), T, D.nh_local, D.ng_local, D.d);
    } else {  // the group's query heads, then this rank's nh_local of them
      Buf q_all(sz(T * D.qh_local * D.d));
      cpu::qkv_split(q_all.data(), A.k.data(), A.v.data(), qkv.data(), T, D.qh_local, D.ng_local, D.d);
      const int64_t first = (D.tp_rank % D.kv_rep) * D.nh_local * D.d, w = D.nh_local * D.d;
      for (int64_t i = 0; i < T; ++i) std::memcpy(&A.q[sz(i * w)], &q_all[sz(i * D.qh_local * D.d + first)], sz(w) * sizeof(float));
    }
    if (D.qk_norm) {
      A.q_in = A.q;
      A.k_in = A.k;
      head_norm_forward(A.q.data(), A.q_mean, A.q_rstd, A.q_in.data(), ly.qn_w, ly.qn_b, T * D.nh_local);
      head_norm_forward(A.k.data(), A.k_mean, A.k_rstd, A.k_in.data(), ly.kn_w, ly.kn_b, T * D.ng_local);
    }
    if (D.rope) {
      cpu::rope_forward(A.q.data(), mb.positions.data(), T, D.nh_local, D.d, D.rot_dim, D.rope_base);
      cpu::rope_forward(A.k.data(), mb.positions.data(), T, D.ng_local, D.d, D.rot_dim, D.rope_base);
    }
    A.probs.resize(sz(B * D.nh_local * S * S));
    A.ctx.resize(sz(T * D.nh_local * D.d));
    cpu::AttentionShape as{B, S, D.nh_local, D.ng_local, D.d, D.softmax_scale, ad,
                           dropout_key(seed_, step, 0, l, kDropAttnProbs), mb.first_sample, D.tp_rank * D.nh_local,
                           mb.row_start.empty() ? nullptr : mb.row_start.data()};
    cpu::attention_forward(A.ctx.data(), A.probs.data(), A.q.data(), A.k.data(), A.v.data(), as);
    Buf proj(sz(T * h)), proj_local(sz(Tl * h));
    cpu::linear_forward(proj.data(), A.ctx.data(), P(ly.proj_w), nullptr, T, D.nh_local * D.d, h);
    reduce_tokens(proj.data(), proj_local.data(), Tl);
    if (D.bias) {
      for (int64_t i = 0; i < Tl * h; ++i) proj_local[sz(i)] += P(ly.proj_b)[i % h];
    }
    dropout_tokens(proj_local.data(), t0, Tl, l, kDropAttnOut, false);
    A.x2.resize(sz(Tl * h));
    for (int64_t i = 0; i < Tl * h; ++i) A.x2[sz(i)] = A.x[sz(i)] + proj_local[sz(i)];
    A.ln2.resize(sz(Tl * h));
    A.mean2.resize(sz(Tl));
    A.rstd2.resize(sz(Tl));
    norm_forward(A.ln2.data(), A.mean2.data(), A.rstd2.data(), A.x2.data(), ly.ln2_w, ly.ln2_b, Tl);
    A.ln2_full.resize(sz(T * h));
    gather_tokens(A.ln2.data(), A.ln2_full.data(), Tl);
    A.fc1.resize(sz(T * fc1_out));
    cpu::linear_forward(A.fc1.data(), A.ln2_full.data(), P(ly.fc1_w), D.bias ? P(ly.fc1_b) : nullptr, T, h, fc1_out);
    A.act.resize(sz(T * D.F_local));
    if (D.swiglu) cpu::swiglu_forward(A.act.data(), A.fc1.data(), T, D.F_local);
    else cpu::gelu_forward(A.act.data(), A.fc1.data(), T * D.F_local);
    Buf fc2(sz(T * h)), fc2_local(sz(Tl * h));
    cpu::linear_forward(fc2.data(), A.act.data(), P(ly.fc2_w), nullptr, T, D.F_local, h);
    reduce_tokens(fc2.data(), fc2_local.data(), Tl);
    if (D.bias) {
      for (int64_t i = 0; i < Tl * h; ++i) fc2_local[sz(i)] += P(ly.fc2_b)[i % h];
    }
    dropout_tokens(fc2_local.data(), t0, Tl, l, kDropMlpOut, false);
    x.resize(sz(Tl * h));
    for (int64_t i = 0; i < Tl * h; ++i) x[sz(i)] = A.x2[sz(i)] + fc2_local[sz(i)];
  }
  R.x_final = std::move(x);
  R.lnf.resize(sz(Tl * h));
  R.meanf.resize(sz(Tl));
  R.rstdf.resize(sz(Tl));
  norm_forward(R.lnf.data(), R.meanf.data(), R.rstdf.data(), R.x_final.data(), final_w_, final_b_, Tl);
  R.lnf_full.resize(sz(T * h));
  gather_tokens(R.lnf.data(), R.lnf_full.data(), Tl);
  // Output layer: column-parallel over the vocabulary; the loss combines the shards (no full logits).
  R.logits.resize(sz(T * D.V_local));
  cpu::linear_forward(R.logits.data(), R.lnf_full.data(), P(out_w_), nullptr, T, h, D.V_local);
  R.lse.resize(sz(T));
  R.losses.resize(sz(T));
  cpu::VocabReduce reduce{[this](float* v, int64_t n) { groups_.tp->all_reduce(v, n, ReduceOp::kMax); },
                          [this](float* v, int64_t n) { groups_.tp->all_reduce(v, n, ReduceOp::kSum); }};
  cpu::cross_entropy_forward(R.losses.data(), R.lse.data(), R.logits.data(), mb.labels.data(), T, D.V_local,
                             D.tp_rank * D.V_local, D.tp > 1 ? &reduce : nullptr);
  double num = 0, den = 0;
  for (int64_t i = 0; i < T; ++i) {
    num += static_cast<double>(R.losses[sz(i)]) * mb.loss_mask[sz(i)];
    den += mb.loss_mask[sz(i)];
  }
  R.denom = static_cast<float>(std::max(den, 1.0));
  return static_cast<float>(num / std::max(den, 1.0));
}

void GPTModel::backward(float scale, bool last_microbatch) {
  finishing_ = last_microbatch;
  const ModelDims& D = dims_;
  Record& R = *rec_;
  const Microbatch& mb = R.mb;
  const int64_t B = mb.B, S = mb.S, T = B * S, h = D.h;
  const int64_t Tl = D.sequence_parallel ? T / D.tp : T;
  const int64_t t0 = D.sequence_parallel ? D.tp_rank * Tl : 0;
  const float ad = R.training ? D.attention_dropout : 0.0f;
  const int64_t qkv_local = (D.qh_local + 2 * D.ng_local) * D.d;
  const int64_t fc1_out = D.F_local * (D.swiglu ? 2 : 1);
  auto P = [&](size_t i) { return params_.param(i); };
  auto G = [&](size_t i) { return params_.grad(i); };
  auto sz = [](int64_t n) { return static_cast<size_t>(n); };
  auto ready = [&](size_t first_param) {
    if (grads_ready_ && finishing_) grads_ready_(first_param == 0 ? 0 : params_.info(first_param).offset);
  };

  // Loss -> logits (gradient written over the logits) -> final norm input.
  Buf dloss(sz(T));
  for (int64_t i = 0; i < T; ++i) dloss[sz(i)] = mb.loss_mask[sz(i)] * scale / R.denom;
  cpu::cross_entropy_backward(R.logits.data(), R.logits.data(), R.lse.data(), mb.labels.data(), dloss.data(), T, D.V_local,
                              D.tp_rank * D.V_local);
  Buf dfull(sz(T * h)), dlocal(sz(Tl * h));
  cpu::linear_backward(dfull.data(), G(out_w_), nullptr, R.logits.data(), R.lnf_full.data(), P(out_w_), T, h, D.V_local);
  reduce_tokens(dfull.data(), dlocal.data(), Tl);
  Buf dx(sz(Tl * h));
  norm_backward(dx.data(), dlocal.data(), R.x_final.data(), R.meanf.data(), R.rstdf.data(), final_w_, final_b_, Tl);
  all_reduce_replicated_grads(final_w_, params_.size());
  if (!D.tied) ready(final_w_);

  Buf dbranch(sz(Tl * h));
  for (int64_t l = D.L - 1; l >= 0; --l) {
    const Layer& ly = layers_[sz(l)];
    auto& A = R.layers[sz(l)];
    // MLP branch: out = x2 + drop(fc2(act(fc1(norm2(x2)))) + b2)
    std::memcpy(dbranch.data(), dx.data(), sz(Tl * h) * sizeof(float));
    dropout_tokens(dbranch.data(), t0, Tl, l, kDropMlpOut, true);
    if (D.bias) {
      for (int64_t i = 0; i < Tl * h; ++i) G(ly.fc2_b)[i % h] += dbranch[sz(i)];
    }
    gather_tokens(dbranch.data(), dfull.data(), Tl);
    Buf dact(sz(T * D.F_local));
    cpu::linear_backward(dact.data(), G(ly.fc2_w), nullptr, dfull.data(), A.act.data(), P(ly.fc2_w), T, D.F_local, h);
    Buf dfc1(sz(T * fc1_out));
    if (D.swiglu) cpu::swiglu_backward(dfc1.data(), dact.data(), A.fc1.data(), T, D.F_local);
    else cpu::gelu_backward(dfc1.data(), dact.data(), A.fc1.data(), T * D.F_local);
    cpu::linear_backward(dfull.data(), G(ly.fc1_w), D.bias ? G(ly.fc1_b) : nullptr, dfc1.data(), A.ln2_full.data(), P(ly.fc1_w), T, h, fc1_out);
    reduce_tokens(dfull.data(), dlocal.data(), Tl);
    Buf dx2(sz(Tl * h));
    norm_backward(dx2.data(), dlocal.data(), A.x2.data(), A.mean2.data(), A.rstd2.data(), ly.ln2_w, ly.ln2_b, Tl);
    for (int64_t i = 0; i < Tl * h; ++i) dx2[sz(i)] += dx[sz(i)];

    // Attention branch: x2 = x + drop(proj(attn(rope(split(qkv(norm1(x)))))) + bp)
    std::memcpy(dbranch.data(), dx2.data(), sz(Tl * h) * sizeof(float));
    dropout_tokens(dbranch.data(), t0, Tl, l, kDropAttnOut, true);
    if (D.bias) {
      for (int64_t i = 0; i < Tl * h; ++i) G(ly.proj_b)[i % h] += dbranch[sz(i)];
    }
    gather_tokens(dbranch.data(), dfull.data(), Tl);
    Buf dctx(sz(T * D.nh_local * D.d));
    cpu::linear_backward(dctx.data(), G(ly.proj_w), nullptr, dfull.data(), A.ctx.data(), P(ly.proj_w), T, D.nh_local * D.d, h);
    Buf dq(A.q.size()), dk(A.k.size()), dv(A.v.size()), scratch(sz(S * S));
    cpu::AttentionShape as{B, S, D.nh_local, D.ng_local, D.d, D.softmax_scale, ad,
                           dropout_key(seed_, R.step, 0, l, kDropAttnProbs), mb.first_sample, D.tp_rank * D.nh_local,
                           mb.row_start.empty() ? nullptr : mb.row_start.data()};
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), dctx.data(), A.probs.data(), A.q.data(), A.k.data(), A.v.data(), as,
                            scratch.data());
    if (D.rope) {
      cpu::rope_backward(dq.data(), mb.positions.data(), T, D.nh_local, D.d, D.rot_dim, D.rope_base);
      cpu::rope_backward(dk.data(), mb.positions.data(), T, D.ng_local, D.d, D.rot_dim, D.rope_base);
    }
    if (D.qk_norm) {
      Buf dq_in(dq.size()), dk_in(dk.size());
      head_norm_backward(dq_in.data(), dq.data(), A.q_in.data(), A.q_mean, A.q_rstd, ly.qn_w, ly.qn_b, T * D.nh_local);
      head_norm_backward(dk_in.data(), dk.data(), A.k_in.data(), A.k_mean, A.k_rstd, ly.kn_w, ly.kn_b, T * D.ng_local);
      dq = std::move(dq_in);
      dk = std::move(dk_in);
      // Each TP rank's heads add to the shared weights: sum over TP (under SP the layer's replicated
      // parameters are summed below with the norms').
      if (D.tp > 1 && !D.sequence_parallel && finishing_) {
        for (size_t i = ly.qn_w; i < ly.proj_w; ++i) groups_.tp->all_reduce(params_.grad(i), params_.info(i).numel, ReduceOp::kSum);
      }
    }
    Buf dqkv(sz(T * qkv_local));
    if (D.kv_rep == 1) {
      cpu::qkv_merge(dqkv.data(), dq.data(), dk.data(), dv.data(), T, D.nh_local, D.ng_local, D.d);
    } else {  // zero for the group's query heads other ranks own; their gradients arrive in the replica sum
      Buf dq_all(sz(T * D.qh_local * D.d), 0.0f);
      const int64_t first = (D.tp_rank % D.kv_rep) * D.nh_local * D.d, w = D.nh_local * D.d;
      for (int64_t i = 0; i < T; ++i) std::memcpy(&dq_all[sz(i * D.qh_local * D.d + first)], &dq[sz(i * w)], sz(w) * sizeof(float));
      cpu::qkv_merge(dqkv.data(), dq_all.data(), dk.data(), dv.data(), T, D.qh_local, D.ng_local, D.d);
    }
    cpu::linear_backward(dfull.data(), G(ly.qkv_w), D.bias ? G(ly.qkv_b) : nullptr, dqkv.data(), A.ln1_full.data(), P(ly.qkv_w), T, h, qkv_local);
    reduce_tokens(dfull.data(), dlocal.data(), Tl);
    norm_backward(dx.data(), dlocal.data(), A.x.data(), A.mean1.data(), A.rstd1.data(), ly.ln1_w, ly.ln1_b, Tl);
    for (int64_t i = 0; i < Tl * h; ++i) dx[sz(i)] += dx2[sz(i)];
    const size_t next = l + 1 < D.L ? layers_[sz(l + 1)].ln1_w : final_w_;
    all_reduce_replicated_grads(ly.ln1_w, next);
    if (kv_group_ && finishing_) {
      // Every replica of the group's QKV block gets the sum: its own query heads' rows from their owner,
      // and the K/V rows from all the group's query heads.
      kv_group_->all_reduce(G(ly.qkv_w), params_.info(ly.qkv_w).numel, ReduceOp::kSum);
      if (D.bias) kv_group_->all_reduce(G(ly.qkv_b), params_.info(ly.qkv_b).numel, ReduceOp::kSum);
    }
    ready(ly.ln1_w);
  }
  dropout_tokens(dx.data(), t0, Tl, -1, kDropEmbedding, true);
  if (D.learned_pos) {
    float* dwpe = G(wpe_);
    for (int64_t i = 0; i < Tl; ++i) {
      float* pr = dwpe + static_cast<int64_t>(mb.positions[sz(t0 + i)]) * h;
      for (int64_t j = 0; j < h; ++j) pr[j] += dx[sz(i * h + j)];
    }
    all_reduce_replicated_grads(wpe_, wpe_ + 1);
  }
  gather_tokens(dx.data(), dfull.data(), Tl);
  cpu::embedding_backward(G(wte_), nullptr, dfull.data(), mb.tokens.data(), nullptr, T, h, D.tp_rank * D.V_local, D.V_local);
  ready(0);
}

}  // namespace mt
