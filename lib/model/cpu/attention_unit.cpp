// attention_unit.cpp: the attention slot of a transformer layer on the CPU engine: input norm, column-parallel
// QKV in Megatron's grouped layout (K/V replicated over TP when query groups are fewer than TP ranks),
// --qk-layernorm, RoPE, attention with dropout (and --softmax-type's sinks), row-parallel projection, dropout and the residual add.
#include <cstring>

#include "kernels/cpu/attention.h"
#include "model/cpu/linear_gemms.h"
#include "kernels/cpu/rope.h"
#include "model/cpu/units.h"

namespace mt::cpu {
namespace {

// sink: the heads' sink logits with --softmax-type (a learned parameter, or off-by-one's zeros), null without;
// sink_grad: where the backward adds the learned logits' gradient.
// sink_probs: each row's sink probability, which the forward writes and the backward reads.
AttentionShape attention_shape(const PassContext& c, int64_t layer, const float* sink = nullptr, float* sink_grad = nullptr,
                               float* sink_probs = nullptr) {
  const ModelDims& D = c.D;
  return AttentionShape{c.mb.B, c.mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, c.training ? D.attention_dropout : 0.0f,
                        dropout_key(c.seed, c.step, 0, layer, kDropAttnProbs), c.mb.first_sample, D.tp_rank * D.nh_local,
                        c.mb.row_start.empty() ? nullptr : c.mb.row_start.data(), D.window_in(layer), sink, sink_grad, sink_probs};
}

// The sink logits of the layer's local heads (--softmax-type), or null.
const float* sink_logits(const PassContext& c, const LayerParams& ly, std::vector<float>& zeros) {
  if (c.D.sink == ModelDims::Sink::kLearnable) return c.P(ly.softmax_offset);
  if (c.D.sink == ModelDims::Sink::kNone) return nullptr;
  zeros.assign(sz(c.D.nh_local), 0.0f);
  return zeros.data();
}

}  // namespace

void core_attention_forward(const PassContext& c, const LayerParams& ly, AttentionUnit::Stash& A) {
  const ModelDims& D = c.D;
  A.ctx.resize(sz(c.T * D.nh_local * D.d));
  std::vector<float> zeros;
  if (D.cp > 1) {  // the keys of the whole sequence from the CP ranks
    context_attention_forward(c, ly.layer, A.q, A.k, A.v, A.ctx, A.cp, sink_logits(c, ly, zeros));
  } else {
    A.probs.resize(sz(c.mb.B * D.nh_local * c.mb.S * c.mb.S));
    if (D.sink != ModelDims::Sink::kNone) A.sink_probs.resize(sz(c.mb.B * D.nh_local * c.mb.S));
    attention_forward(A.ctx.data(), A.probs.data(), A.q.data(), A.k.data(), A.v.data(),
                      attention_shape(c, ly.layer, sink_logits(c, ly, zeros), nullptr, A.sink_probs.empty() ? nullptr : A.sink_probs.data()));
  }
}

void core_attention_backward(const PassContext& c, const LayerParams& ly, const Buf& dctx, Buf& dq, Buf& dk, Buf& dv, AttentionUnit::Stash& A) {
  const ModelDims& D = c.D;
  dq.resize(A.q.size());
  dk.resize(A.k.size());
  dv.resize(A.v.size());
  std::vector<float> zeros;
  const float* sink = sink_logits(c, ly, zeros);
  float* sink_grad = D.sink == ModelDims::Sink::kLearnable ? c.G(ly.softmax_offset) : nullptr;
  if (D.cp > 1) {
    context_attention_backward(c, ly.layer, dctx, A.q, A.k, A.v, dq, dk, dv, A.cp, sink, sink_grad);
  } else {
    Buf scratch(sz(c.mb.S * c.mb.S));
    attention_backward(dq.data(), dk.data(), dv.data(), dctx.data(), A.probs.data(), A.q.data(), A.k.data(), A.v.data(),
                       attention_shape(c, ly.layer, sink, sink_grad, A.sink_probs.empty() ? nullptr : A.sink_probs.data()), scratch.data());
  }
}

void attention_slot_input(const PassContext& c, const LayerParams& ly, Buf& x, AttentionUnit::Stash& A) {
  const int64_t Tl = c.Tl, h = c.D.h;
  A.x = std::move(x);
  A.ln.resize(sz(Tl * h));
  A.mean.resize(sz(Tl));
  A.rstd.resize(sz(Tl));
  c.norm_forward(A.ln.data(), A.mean.data(), A.rstd.data(), A.x.data(), ly.input_norm_w, ly.input_norm_b, Tl, h);
  A.ln_full.resize(sz(c.T * h));
  c.gather_tokens(A.ln.data(), A.ln_full.data());
}

void attention_slot_output(const PassContext& c, const LayerParams& ly, const Buf& ctx, int64_t width, Buf& x, AttentionUnit::Stash& A) {
  const int64_t T = c.T, Tl = c.Tl, h = c.D.h;
  Buf proj(sz(T * h)), proj_local(sz(Tl * h));
  linear_unit_forward(c, ly.layer, kLinearProj, A.proj_lin, proj.data(), ctx.data(), ly.proj_w, kNoParam, T, width, h);
  c.reduce_tokens(proj.data(), proj_local.data());
  if (c.D.bias) {
    for (int64_t i = 0; i < Tl * h; ++i) proj_local[sz(i)] += c.P(ly.proj_b)[i % h];
  }
  c.dropout_tokens(proj_local.data(), ly.layer, kDropAttnOut, false);
  x.resize(sz(Tl * h));
  for (int64_t i = 0; i < Tl * h; ++i) x[sz(i)] = A.x[sz(i)] + proj_local[sz(i)];
}

void attention_slot_output_backward(const PassContext& c, const LayerParams& ly, const Buf& dout, const Buf& ctx, int64_t width, Buf& dctx,
                                    AttentionUnit::Stash& A) {
  const int64_t T = c.T, Tl = c.Tl, h = c.D.h;
  Buf branch = dout, full(sz(T * h));
  c.dropout_tokens(branch.data(), ly.layer, kDropAttnOut, true);
  if (c.D.bias) {
    for (int64_t i = 0; i < Tl * h; ++i) c.G(ly.proj_b)[i % h] += branch[sz(i)];
  }
  c.gather_tokens(branch.data(), full.data());
  dctx.resize(sz(T * width));
  linear_unit_backward(c, ly.layer, kLinearProj, A.proj_lin, dctx.data(), full.data(), ly.proj_w, kNoParam, ctx.data(), T, width, h);
}

void attention_slot_input_backward(const PassContext& c, const LayerParams& ly, Buf& dln_full, const Buf& dout, Buf& dx, AttentionUnit::Stash& A) {
  const int64_t Tl = c.Tl, h = c.D.h;
  Buf local(sz(Tl * h));
  c.reduce_tokens(dln_full.data(), local.data());
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), local.data(), A.x.data(), A.mean.data(), A.rstd.data(), ly.input_norm_w, ly.input_norm_b, Tl, h);
  for (int64_t i = 0; i < Tl * h; ++i) dx[sz(i)] += dout[sz(i)];
}

void AttentionUnit::forward(const PassContext& c, Buf& x, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  if (D.mla) {
    mla_attention_forward(c, ly, x, A);
    return;
  }
  const int64_t T = c.T, h = D.h;
  const int64_t qkv_local = (D.qh_local + 2 * D.ng_local) * D.d;
  attention_slot_input(c, ly, x, A);
  Buf qkv(sz(T * qkv_local));
  linear_unit_forward(c, ly.layer, kLinearQkv, A.qkv_lin, qkv.data(), A.ln_full.data(), ly.qkv_w, D.qkv_bias ? ly.qkv_b : kNoParam, T, h, qkv_local);
  A.q.resize(sz(T * D.nh_local * D.d));
  A.k.resize(sz(T * D.ng_local * D.d));
  A.v.resize(sz(T * D.ng_local * D.d));
  if (D.kv_rep == 1) {
    qkv_split(A.q.data(), A.k.data(), A.v.data(), qkv.data(), T, D.nh_local, D.ng_local, D.d);
  } else {  // the group's query heads, then this rank's nh_local of them
    Buf q_all(sz(T * D.qh_local * D.d));
    qkv_split(q_all.data(), A.k.data(), A.v.data(), qkv.data(), T, D.qh_local, D.ng_local, D.d);
    const int64_t first = (D.tp_rank % D.kv_rep) * D.nh_local * D.d, w = D.nh_local * D.d;
    for (int64_t i = 0; i < T; ++i) std::memcpy(&A.q[sz(i * w)], &q_all[sz(i * D.qh_local * D.d + first)], sz(w) * sizeof(float));
  }
  if (D.qk_norm) {
    A.q_in = A.q;
    A.k_in = A.k;
    const int64_t nq = T * D.nh_local, nk = T * D.ng_local;
    A.q_mean.resize(sz(nq));
    A.q_rstd.resize(sz(nq));
    A.k_mean.resize(sz(nk));
    A.k_rstd.resize(sz(nk));
    c.norm_forward(A.q.data(), A.q_mean.data(), A.q_rstd.data(), A.q_in.data(), ly.q_norm_w, ly.q_norm_b, nq, D.d);
    c.norm_forward(A.k.data(), A.k_mean.data(), A.k_rstd.data(), A.k_in.data(), ly.k_norm_w, ly.k_norm_b, nk, D.d);
  }
  if (D.rope_in(ly.layer)) {
    rope_forward(A.q.data(), rope_positions(c.mb), T, D.nh_local, D.d, D.rot_dim, D.rope_base, D.rotary_interleaved, D.rope_scaling);
    rope_forward(A.k.data(), rope_positions(c.mb), T, D.ng_local, D.d, D.rot_dim, D.rope_base, D.rotary_interleaved, D.rope_scaling);
  }
  core_attention_forward(c, ly, A);
  attention_slot_output(c, ly, A.ctx, D.nh_local * D.d, x, A);
}

void AttentionUnit::backward(const PassContext& c, const Buf& dout, Buf& dx, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  if (D.mla) {
    mla_attention_backward(c, ly, dout, dx, A);
    return;
  }
  const int64_t T = c.T, h = D.h, Hd = D.nh_local * D.d;
  const int64_t qkv_local = (D.qh_local + 2 * D.ng_local) * D.d;
  Buf dctx, full(sz(T * h));
  attention_slot_output_backward(c, ly, dout, A.ctx, Hd, dctx, A);
  Buf dq, dk, dv;
  core_attention_backward(c, ly, dctx, dq, dk, dv, A);
  if (D.rope_in(ly.layer)) {
    rope_backward(dq.data(), rope_positions(c.mb), T, D.nh_local, D.d, D.rot_dim, D.rope_base, D.rotary_interleaved, D.rope_scaling);
    rope_backward(dk.data(), rope_positions(c.mb), T, D.ng_local, D.d, D.rot_dim, D.rope_base, D.rotary_interleaved, D.rope_scaling);
  }
  if (D.qk_norm) {
    Buf dq_in(dq.size()), dk_in(dk.size());
    c.norm_backward(dq_in.data(), dq.data(), A.q_in.data(), A.q_mean.data(), A.q_rstd.data(), ly.q_norm_w, ly.q_norm_b, T * D.nh_local, D.d);
    c.norm_backward(dk_in.data(), dk.data(), A.k_in.data(), A.k_mean.data(), A.k_rstd.data(), ly.k_norm_w, ly.k_norm_b, T * D.ng_local, D.d);
    dq = std::move(dq_in);
    dk = std::move(dk_in);
    // Each TP rank's heads add to the shared weights: sum over TP (under SP the layer's replicated
    // parameters are summed with the norms' at the end of the layer).
    if (D.tp > 1 && !D.sequence_parallel && c.finishing) {
      for (size_t i : {ly.q_norm_w, ly.q_norm_b, ly.k_norm_w, ly.k_norm_b}) {
        if (i != kNoParam) c.groups.tp->all_reduce(c.G(i), c.params.info(i).numel, ReduceOp::kSum);
      }
    }
  }
  Buf dqkv(sz(T * qkv_local));
  if (D.kv_rep == 1) {
    qkv_merge(dqkv.data(), dq.data(), dk.data(), dv.data(), T, D.nh_local, D.ng_local, D.d);
  } else {  // zero for the group's query heads other ranks own; their gradients arrive in the replica sum
    Buf dq_all(sz(T * D.qh_local * D.d), 0.0f);
    const int64_t first = (D.tp_rank % D.kv_rep) * D.nh_local * D.d, w = D.nh_local * D.d;
    for (int64_t i = 0; i < T; ++i) std::memcpy(&dq_all[sz(i * D.qh_local * D.d + first)], &dq[sz(i * w)], sz(w) * sizeof(float));
    qkv_merge(dqkv.data(), dq_all.data(), dk.data(), dv.data(), T, D.qh_local, D.ng_local, D.d);
  }
  linear_unit_backward(c, ly.layer, kLinearQkv, A.qkv_lin, full.data(), dqkv.data(), ly.qkv_w, D.qkv_bias ? ly.qkv_b : kNoParam, A.ln_full.data(), T, h,
                       qkv_local);
  attention_slot_input_backward(c, ly, full, dout, dx, A);
}

}  // namespace mt::cpu
