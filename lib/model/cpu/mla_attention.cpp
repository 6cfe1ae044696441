// mla_attention.cpp: multi-latent attention (DeepSeek-V2/V3's; Megatron's MLASelfAttention) as the attention slot of a
// CPU layer. From the input norm's output x (every token of the TP group: SP gathers it):
//   queries  q = W_q x, or W_qu norm(W_qd x) through the rank-q_lora_rank latent; per head [q_nope (dn) | q_pe (dr)]
//   keys     [c_kv (kv_lora_rank) | k_pe (dr)] = W_kvd x;  per head [k_nope (dn) | v (dv)] = W_kvu norm(c_kv)
//   RoPE     on q_pe and k_pe only (Megatron's MLA RoPE: the pairs (2i, 2i + 1) de-interleaved, then rotated by halves,
//            which gives the scores of the pairs rotated in place: computed here as interleaved RoPE), k_pe one head
//            that every head shares
//   then attention of [q_nope | q_pe] against [k_nope | k_pe] (MLA's softmax scale), the values' context through the
//   row-parallel output projection. The down projections and their norms are whole on every TP rank (Megatron's
//   duplicated linears); the up projections split the heads over TP. Each rank's heads give a part of the latents'
//   (and k_pe's) gradients, so those parameters' gradients are summed over TP: here at the layer's end without SP
//   (Megatron's column-parallel backward all-reduces the latents' gradient instead: the same sum), with SP by the
//   layer's replicated-parameter sum. The core attention takes one head width: q, k and v are padded with zeros to
//   max(dn + dr, dv), which adds nothing to the scores or the context.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/rope.h"
#include "model/cpu/linear_gemms.h"
#include "model/cpu/units.h"

namespace mt::cpu {
namespace {

// The core attention's view of the model: one head width (padded), as many key heads as query heads.
ModelDims core_dims(const ModelDims& D) {
  ModelDims core = D;
  core.d = std::max(D.d, D.v_dim);
  core.ng = D.nh;
  core.ng_local = D.nh_local;
  core.qh_local = D.nh_local;
  core.kv_rep = 1;
  return core;
}

// A copy of c whose units see `dims` (the core attention's).
PassContext with_dims(const PassContext& c, const ModelDims& dims) {
  PassContext core(dims, c.params, c.groups, c.seed, c.mb, c.step, c.training);
  core.T = c.T;
  core.Tl = c.Tl;
  core.t0 = c.t0;
  core.finishing = c.finishing;
  core.loss_grad_scale = c.loss_grad_scale;
  core.moe_stats = c.moe_stats;
  core.deferred = c.deferred;
  core.fp8 = c.fp8;
  core.fp8_record = c.fp8_record;
  core.fp8_cast_weights = c.fp8_cast_weights;
  return core;
}

// dx += dy W for a linear layer (linear_unit_backward overwrites its input gradient).
void linear_backward_adding(const PassContext& c, int64_t layer, LinearStash& st, Buf& dx, const float* dy, size_t w, const float* x, int64_t N,
                            int64_t in, int64_t out) {
  Buf part(sz(N * in));
  linear_unit_backward(c, layer, kLinearQkv, st, part.data(), dy, w, kNoParam, x, N, in, out);
  for (size_t i = 0; i < part.size(); ++i) dx[i] += part[i];
}

// A latent [T, width] through its norm (--qk-layernorm), or as it is: out, and the norm's statistics where it has one.
void latent_norm_forward(const PassContext& c, const Buf& in, Buf& out, Buf& mean, Buf& rstd, size_t w, size_t b, int64_t width) {
  if (!c.D.qk_norm) {
    out = in;
    return;
  }
  out.resize(in.size());
  mean.resize(sz(c.T));
  rstd.resize(sz(c.T));
  c.norm_forward(out.data(), mean.data(), rstd.data(), in.data(), w, b, c.T, width);
}

// The latent's gradient before its norm (the norm's weight gradients accumulated), or as it is without one.
Buf latent_norm_backward(const PassContext& c, const Buf& dout, const Buf& in, const Buf& mean, const Buf& rstd, size_t w, size_t b, int64_t width) {
  if (!c.D.qk_norm) return dout;
  Buf din(dout.size());
  c.norm_backward(din.data(), dout.data(), in.data(), mean.data(), rstd.data(), w, b, c.T, width);
  return din;
}

}  // namespace

void mla_attention_forward(const PassContext& c, const LayerParams& ly, Buf& x, AttentionUnit::Stash& A) {
  const ModelDims& D = c.D;
  const int64_t T = c.T, h = D.h, nh = D.nh_local, dn = D.qk_nope, dr = D.qk_rope, dv = D.v_dim, dq = D.d;
  const int64_t R_kv = D.kv_lora_rank;
  attention_slot_input(c, ly, x, A);
  // Queries [T, nh, dn + dr]
  Buf q(sz(T * nh * dq));
  if (D.q_lora_rank == 0) {
    linear_unit_forward(c, ly.layer, kLinearQkv, A.q_lin, q.data(), A.ln_full.data(), ly.q_proj_w, kNoParam, T, h, nh * dq);
  } else {
    const int64_t R_q = D.q_lora_rank;
    A.q_latent_in.resize(sz(T * R_q));
    linear_unit_forward(c, ly.layer, kLinearQkv, A.q_lin, A.q_latent_in.data(), A.ln_full.data(), ly.q_down_w, kNoParam, T, h, R_q);
    latent_norm_forward(c, A.q_latent_in, A.q_latent, A.q_latent_mean, A.q_latent_rstd, ly.q_latent_norm_w, ly.q_latent_norm_b, R_q);
    linear_unit_forward(c, ly.layer, kLinearQkv, A.q_up_lin, q.data(), A.q_latent.data(), ly.q_up_w, kNoParam, T, R_q, nh * dq);
  }
  // The keys' and values' latent and the shared RoPE key [T, kv_lora_rank + dr]
  Buf kv_down(sz(T * (R_kv + dr)));
  linear_unit_forward(c, ly.layer, kLinearQkv, A.kv_down_lin, kv_down.data(), A.ln_full.data(), ly.kv_down_w, kNoParam, T, h, R_kv + dr);
  A.kv_latent_in.resize(sz(T * R_kv));
  Buf k_pe(sz(T * dr));
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&A.kv_latent_in[sz(t * R_kv)], &kv_down[sz(t * (R_kv + dr))], sz(R_kv) * sizeof(float));
    std::memcpy(&k_pe[sz(t * dr)], &kv_down[sz(t * (R_kv + dr) + R_kv)], sz(dr) * sizeof(float));
  }
  latent_norm_forward(c, A.kv_latent_in, A.kv_latent, A.kv_latent_mean, A.kv_latent_rstd, ly.kv_latent_norm_w, ly.kv_latent_norm_b, R_kv);
  Buf kv(sz(T * nh * (dn + dv)));
  linear_unit_forward(c, ly.layer, kLinearQkv, A.kv_up_lin, kv.data(), A.kv_latent.data(), ly.kv_up_w, kNoParam, T, R_kv, nh * (dn + dv));
  // RoPE on the queries' and the key's dr parts
  Buf q_pe(sz(T * nh * dr));
  for (int64_t i = 0; i < T * nh; ++i) std::memcpy(&q_pe[sz(i * dr)], &q[sz(i * dq + dn)], sz(dr) * sizeof(float));
  rope_forward(q_pe.data(), rope_positions(c.mb), T, nh, dr, dr, D.rope_base, true, D.rope_scaling);
  rope_forward(k_pe.data(), rope_positions(c.mb), T, 1, dr, dr, D.rope_base, true, D.rope_scaling);
  // The core attention's heads, padded to one width
  const ModelDims core = core_dims(D);
  const int64_t da = core.d;
  A.q.assign(sz(T * nh * da), 0.0f);
  A.k.assign(sz(T * nh * da), 0.0f);
  A.v.assign(sz(T * nh * da), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t i = t * nh + j;
      float* qo = &A.q[sz(i * da)];
      float* ko = &A.k[sz(i * da)];
      std::memcpy(qo, &q[sz(i * dq)], sz(dn) * sizeof(float));
      std::memcpy(qo + dn, &q_pe[sz(i * dr)], sz(dr) * sizeof(float));
      std::memcpy(ko, &kv[sz(i * (dn + dv))], sz(dn) * sizeof(float));
      std::memcpy(ko + dn, &k_pe[sz(t * dr)], sz(dr) * sizeof(float));
      std::memcpy(&A.v[sz(i * da)], &kv[sz(i * (dn + dv) + dn)], sz(dv) * sizeof(float));
    }
  }
  const PassContext cc = with_dims(c, core);
  core_attention_forward(cc, ly, A);
  A.ctx_v.resize(sz(T * nh * dv));
  for (int64_t i = 0; i < T * nh; ++i) std::memcpy(&A.ctx_v[sz(i * dv)], &A.ctx[sz(i * da)], sz(dv) * sizeof(float));
  attention_slot_output(c, ly, A.ctx_v, nh * dv, x, A);  // (the output projection, row-parallel)
}

void mla_attention_backward(const PassContext& c, const LayerParams& ly, const Buf& dout, Buf& dx, AttentionUnit::Stash& A) {
  const ModelDims& D = c.D;
  const int64_t T = c.T, h = D.h, nh = D.nh_local, dn = D.qk_nope, dr = D.qk_rope, dv = D.v_dim, dq = D.d;
  const int64_t R_kv = D.kv_lora_rank;
  const ModelDims core = core_dims(D);
  const int64_t da = core.d;
  Buf dctx_v, full(sz(T * h));
  attention_slot_output_backward(c, ly, dout, A.ctx_v, nh * dv, dctx_v, A);
  Buf dctx(sz(T * nh * da), 0.0f);
  for (int64_t i = 0; i < T * nh; ++i) std::memcpy(&dctx[sz(i * da)], &dctx_v[sz(i * dv)], sz(dv) * sizeof(float));
  Buf dQ, dK, dV;
  const PassContext cc = with_dims(c, core);
  core_attention_backward(cc, ly, dctx, dQ, dK, dV, A);
  // Back to the projections' layouts; the shared key's gradient summed over this rank's heads
  Buf dq_all(sz(T * nh * dq)), dkv(sz(T * nh * (dn + dv))), dq_pe(sz(T * nh * dr)), dk_pe(sz(T * dr), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < nh; ++j) {
      const int64_t i = t * nh + j;
      std::memcpy(&dq_all[sz(i * dq)], &dQ[sz(i * da)], sz(dn) * sizeof(float));
      std::memcpy(&dq_pe[sz(i * dr)], &dQ[sz(i * da + dn)], sz(dr) * sizeof(float));
      std::memcpy(&dkv[sz(i * (dn + dv))], &dK[sz(i * da)], sz(dn) * sizeof(float));
      std::memcpy(&dkv[sz(i * (dn + dv) + dn)], &dV[sz(i * da)], sz(dv) * sizeof(float));
      for (int64_t e = 0; e < dr; ++e) dk_pe[sz(t * dr + e)] += dK[sz(i * da + dn + e)];
    }
  }
  rope_backward(dq_pe.data(), rope_positions(c.mb), T, nh, dr, dr, D.rope_base, true, D.rope_scaling);
  rope_backward(dk_pe.data(), rope_positions(c.mb), T, 1, dr, dr, D.rope_base, true, D.rope_scaling);
  for (int64_t i = 0; i < T * nh; ++i) std::memcpy(&dq_all[sz(i * dq + dn)], &dq_pe[sz(i * dr)], sz(dr) * sizeof(float));
  // Keys and values: the up projection, the latent's norm, the down projection (with k_pe's gradient)
  Buf dkv_latent(sz(T * R_kv));
  linear_unit_backward(c, ly.layer, kLinearQkv, A.kv_up_lin, dkv_latent.data(), dkv.data(), ly.kv_up_w, kNoParam, A.kv_latent.data(), T, R_kv,
                       nh * (dn + dv));
  Buf dkv_down(sz(T * (R_kv + dr)));
  const Buf dkv_latent_in =
      latent_norm_backward(c, dkv_latent, A.kv_latent_in, A.kv_latent_mean, A.kv_latent_rstd, ly.kv_latent_norm_w, ly.kv_latent_norm_b, R_kv);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&dkv_down[sz(t * (R_kv + dr))], &dkv_latent_in[sz(t * R_kv)], sz(R_kv) * sizeof(float));
    std::memcpy(&dkv_down[sz(t * (R_kv + dr) + R_kv)], &dk_pe[sz(t * dr)], sz(dr) * sizeof(float));
  }
  linear_unit_backward(c, ly.layer, kLinearQkv, A.kv_down_lin, full.data(), dkv_down.data(), ly.kv_down_w, kNoParam, A.ln_full.data(), T, h,
                       R_kv + dr);
  // Queries
  if (D.q_lora_rank == 0) {
    linear_backward_adding(c, ly.layer, A.q_lin, full, dq_all.data(), ly.q_proj_w, A.ln_full.data(), T, h, nh * dq);
  } else {
    const int64_t R_q = D.q_lora_rank;
    Buf dq_latent(sz(T * R_q));
    linear_unit_backward(c, ly.layer, kLinearQkv, A.q_up_lin, dq_latent.data(), dq_all.data(), ly.q_up_w, kNoParam, A.q_latent.data(), T, R_q,
                         nh * dq);
    const Buf dq_latent_in =
        latent_norm_backward(c, dq_latent, A.q_latent_in, A.q_latent_mean, A.q_latent_rstd, ly.q_latent_norm_w, ly.q_latent_norm_b, R_q);
    linear_backward_adding(c, ly.layer, A.q_lin, full, dq_latent_in.data(), ly.q_down_w, A.ln_full.data(), T, h, R_q);
  }
  // The parameters whole on every TP rank took this rank's heads' part of their gradients: summed over TP once the
  // iteration's microbatches are in (under SP the layer's replicated-parameter sum does it, GPTModel::layer_finished).
  if (D.tp > 1 && !D.sequence_parallel) {
    c.after_weight_grads([&c, &ly] {
      if (!c.finishing) return;
      for (size_t i : {ly.q_down_w, ly.q_latent_norm_w, ly.q_latent_norm_b, ly.kv_down_w, ly.kv_latent_norm_w, ly.kv_latent_norm_b}) {
        if (i != kNoParam) c.groups.tp->all_reduce(c.G(i), c.params.info(i).numel, ReduceOp::kSum);
      }
    });
  }
  attention_slot_input_backward(c, ly, full, dout, dx, A);
}

}  // namespace mt::cpu
