// gpt_cuda_mla.cpp: multi-latent attention's projections (DeepSeek-V2/V3's; Megatron's MLASelfAttention) on the CUDA
// kernels, as the CPU engine computes them (model/cpu/mla_attention.cpp, docs/mla.md). From the input norm's output x:
//   queries  q = W_q x, or W_qu norm(W_qd x) through the query latent; per head [q_nope (dn) | q_pe (dr)], q_pe rotated
//   keys     c_kv = W_kvd[:R] x and k_pe = W_kvd[R:] x (the down projection's two row blocks, two GEMMs, so that each
//            lands in a buffer of its own rows); per head [k_nope (dn) | v (dv)] = W_kvu norm(c_kv); k_pe rotated and
//            shared by every head: the attention's keys [k_nope | k_pe], values v (cuDNN takes values of their own width)
// RoPE is the interleaved form over the dr columns (Megatron's MLA RoPE gives the same scores), YaRN's table where the
// model has it. The backward runs every projection's data and weight gradient here, on the compute stream, and the
// latent norms' weight gradients; the caller's attention_wgrads adds only the output projection's. With
// --recompute-modules mla_up_proj (Megatron's) a layer keeps its latents and the rotated k_pe, and the up projections'
// part of the forward runs again before its attention backward, into buffers every such layer shares. Under TP the up
// projections split the heads (column-parallel), the output projection its input, and the down projections and latent
// norms are whole on every rank, their gradients summed over TP (Megatron's duplicated linears). No context parallelism
// (the capabilities refuse it on this engine).
#include <cstdint>
#include <utility>

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/mla_layout.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/rope.h"
#include "model/cuda/gpt_cuda_state.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

void CudaGPT::mla_projections_forward(int64_t l, Record& r, const RowSpan& sp) {
  require_whole(l, sp, "multi-latent attention");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t n = sp.rows, h = D.h, dr = D.qk_rope, Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
  if (Rq > 0) mla_linear("fwd.gemm.mla_q_down", n, r.xn1, h, lw.q_down_w, Rq, r.mla_q_in);
  bf16* k_pe = r.mla_k_pe ? r.mla_k_pe : s_->mla_k_pe;  // (kept where the up projections are recomputed)
  mla_linear("fwd.gemm.mla_kv_down", n, r.xn1, h, lw.kv_down_w, Rkv, r.mla_kv_in);
  mla_linear("fwd.gemm.mla_kv_down", n, r.xn1, h, lw.kv_down_w + Rkv * h, dr, k_pe);
  MT_PROF("fwd.rope", cuda::rope_apply_16(k_pe, sp.positions, rope_table_, n, 1, dr, dr, 1.0f, stream_, dt_, true));
  mla_up_forward(l, r, sp, k_pe);
}

// y [n, out] = a [n, in] W^T, W the 16-bit weight at w_off (MLA's projections: no bias, no FP8).
void CudaGPT::mla_linear(const char* name, int64_t n, const bf16* a, int64_t in, int64_t w_off, int64_t out, bf16* y) {
  MT_PROF(name, cuda::GemmLt::instance().gemm_ex(false, true, n, out, in, 1.0f, a, in, w(w_off), in, 0.0f, y, out, ab_, ab_, nullptr, stream_));
}

void CudaGPT::mla_up_forward(int64_t l, Record& r, const RowSpan& sp, const bf16* k_pe) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t n = sp.rows, h = D.h, H = D.nh_local, dn = D.qk_nope, dr = D.qk_rope, dv = D.v_dim, dq = D.d;
  const int64_t Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
  auto gemm = [&](const char* name, const bf16* a, int64_t in, int64_t w_off, int64_t out, bf16* y) { mla_linear(name, n, a, in, w_off, out, y); };
  // A latent through its norm (--qk-layernorm); without one the latent is its own output (one buffer).
  auto latent_norm = [&](const bf16* in, bf16* out, float* mean, float* rstd, int64_t w_off, int64_t b_off, int64_t width) {
    if (!D.qk_norm) return;
    MT_PROF("fwd.mla.latent_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = out, .mean = mean, .rstd = rstd, .x = in, .delta = nullptr,
                                                           .w = w(w_off), .b = w(b_off), .w_offset = norm_offset_, .rows = n, .width = width,
                                                           .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
  };
  if (Rq == 0) {
    gemm("fwd.gemm.mla_q", r.xn1, h, lw.q_proj_w, H * dq, r.q);
  } else {
    latent_norm(r.mla_q_in, r.mla_q_lat, r.mla_q_mean, r.mla_q_rstd, lw.q_ln_w, lw.q_ln_b, Rq);
    gemm("fwd.gemm.mla_q_up", r.mla_q_lat, Rq, lw.q_up_w, H * dq, r.q);
  }
  MT_PROF("fwd.rope", cuda::rope_apply_16(r.q + dn, sp.positions, rope_table_, n, H, dq, dr, 1.0f, stream_, dt_, true));
  latent_norm(r.mla_kv_in, r.mla_kv_lat, r.mla_kv_mean, r.mla_kv_rstd, lw.kv_ln_w, lw.kv_ln_b, Rkv);
  gemm("fwd.gemm.mla_kv_up", r.mla_kv_lat, Rkv, lw.kv_up_w, H * (dn + dv), s.mla_kv);
  MT_PROF("fwd.mla.heads", cuda::mla_keys_values(r.k, r.v, s.mla_kv, k_pe, {n, H, dn, dr, dv, dt_}, stream_));
}

void CudaGPT::mla_projections_backward(int64_t l, Record& r, const RowSpan& sp) {
  require_whole(l, sp, "multi-latent attention's backward");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t n = sp.rows, h = D.h, H = D.nh_local, dn = D.qk_nope, dr = D.qk_rope, dv = D.v_dim, dq = D.d;
  const int64_t Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
  const bf16* x = r.xn1;
  bf16* dx = s.dxn;
  // da [n, in] (= or +=, beta) dy [n, out] W, and W's gradient dW [out, in] += dy^T a (written, not accumulated, where
  // it is the iteration's first: wgrad_beta)
  auto dgrad = [&](const char* name, const bf16* dy, int64_t out, int64_t w_off, int64_t in, float beta, bf16* da) {
    MT_PROF(name, lt.gemm_ex(false, false, n, in, out, 1.0f, dy, out, w(w_off), in, beta, da, in, ab_, ab_, nullptr, stream_));
  };
  auto wgrad = [&](const char* name, const bf16* dy, int64_t out, const bf16* a, int64_t in, int64_t w_off) {
    wgrad_with_bias(stream_, name, out, n, dy, a, in, w_off, -1);
  };
  // A latent's gradient through its norm: the gradient before it (the norm's weight gradients accumulated), or as it is.
  auto latent_norm_backward = [&](const bf16* dlat, const bf16* in, const float* mean, const float* rstd, int64_t w_off, int64_t b_off,
                                  int64_t width) -> const bf16* {
    if (!D.qk_norm) return dlat;
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.mla_tmp, 0, static_cast<size_t>(n * width) * 4, stream_)));
    MT_PROF("bwd.mla.latent_norm", cuda::norm_backward_add({.dres = s.mla_tmp, .dres16 = s.mla_dlat_in, .dw = g(w_off), .db = g(b_off), .dy = dlat,
                                                            .x = in, .mean = mean, .rstd = rstd, .w = w(w_off), .w_offset = norm_offset_,
                                                            .rows = n, .width = width, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
    return s.mla_dlat_in;
  };
  // The rotations undone; the keys' and values' gradients back into the up projection's layout, k_pe's summed over the
  // heads
  MT_PROF("bwd.rope", cuda::rope_apply_16(s.dq + dn, sp.positions, rope_table_, n, H, dq, dr, -1.0f, stream_, dt_, true));
  MT_PROF("bwd.mla.heads", cuda::mla_keys_values_backward(s.mla_kv, s.mla_k_pe, s.dk, s.dv, {n, H, dn, dr, dv, dt_}, stream_));
  MT_PROF("bwd.rope", cuda::rope_apply_16(s.mla_k_pe, sp.positions, rope_table_, n, 1, dr, dr, -1.0f, stream_, dt_, true));
  // Keys and values: the up projection, the latent's norm, the down projection's two row blocks
  const int64_t Wkv = H * (dn + dv);
  dgrad("bwd.gemm.mla_kv_up_dgrad", s.mla_kv, Wkv, lw.kv_up_w, Rkv, 0.0f, s.mla_dlat);
  wgrad("bwd.gemm.mla_kv_up_wgrad", s.mla_kv, Wkv, r.mla_kv_lat, Rkv, lw.kv_up_w);
  const bf16* dkv_in = latent_norm_backward(s.mla_dlat, r.mla_kv_in, r.mla_kv_mean, r.mla_kv_rstd, lw.kv_ln_w, lw.kv_ln_b, Rkv);
  dgrad("bwd.gemm.mla_kv_down_dgrad", dkv_in, Rkv, lw.kv_down_w, h, 0.0f, dx);
  dgrad("bwd.gemm.mla_kv_down_dgrad", s.mla_k_pe, dr, lw.kv_down_w + Rkv * h, h, 1.0f, dx);
  wgrad("bwd.gemm.mla_kv_down_wgrad", dkv_in, Rkv, x, h, lw.kv_down_w);
  wgrad("bwd.gemm.mla_kv_down_wgrad", s.mla_k_pe, dr, x, h, lw.kv_down_w + Rkv * h);
  // Queries
  if (Rq == 0) {
    dgrad("bwd.gemm.mla_q_dgrad", s.dq, H * dq, lw.q_proj_w, h, 1.0f, dx);
    wgrad("bwd.gemm.mla_q_wgrad", s.dq, H * dq, x, h, lw.q_proj_w);
    mla_sum_replicated_grads(l);
    return;
  }
  dgrad("bwd.gemm.mla_q_up_dgrad", s.dq, H * dq, lw.q_up_w, Rq, 0.0f, s.mla_dlat);
  wgrad("bwd.gemm.mla_q_up_wgrad", s.dq, H * dq, r.mla_q_lat, Rq, lw.q_up_w);
  const bf16* dq_in = latent_norm_backward(s.mla_dlat, r.mla_q_in, r.mla_q_mean, r.mla_q_rstd, lw.q_ln_w, lw.q_ln_b, Rq);
  dgrad("bwd.gemm.mla_q_down_dgrad", dq_in, Rq, lw.q_down_w, h, 1.0f, dx);
  wgrad("bwd.gemm.mla_q_down_wgrad", dq_in, Rq, x, h, lw.q_down_w);
  mla_sum_replicated_grads(l);
}

// Under TP each rank's heads gave a part of the gradients of the parameters every rank holds whole (the down
// projections, k_pe's rows with them, and the latents' norms): summed over TP once the iteration's last backward has
// added its part. Without SP here; under SP the layer's replicated-parameter sum (sum_replicated_grads) does it, as it
// does the norms'. (The input gradient's parts are summed by the layer's TP reduction of s_->dxn.)
void CudaGPT::mla_sum_replicated_grads(int64_t l) {
  if (!tp_ || sp_ || !final_backward_) return;
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t h = D.h, Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
  tp_->group_start();
  for (const auto& [off, n] : {std::pair{lw.q_down_w, Rq * h}, std::pair{lw.q_ln_w, Rq}, std::pair{lw.q_ln_b, Rq},
                               std::pair{lw.kv_down_w, (Rkv + D.qk_rope) * h}, std::pair{lw.kv_ln_w, Rkv}, std::pair{lw.kv_ln_b, Rkv}}) {
    if (off >= 0) tp_->all_reduce_on(g(off), n, WireType::kF32, ReduceOp::kSum, stream_);
  }
  MT_PROF("tp.mla_replicated_grads", tp_->group_end());
}

}  // namespace mt
