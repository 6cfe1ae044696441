// gpt_cuda_units.cpp: a transformer layer's units on the CUDA kernels, each written once and run over a span of the
// microbatch's rows: the attention block and the MLP block (forward, and backward with the weight gradients apart), and
// the residual adds with the norms between them. layer_forward / layer_backward (gpt_cuda_layer.cpp) schedule them
// over every row; the split TP layers (gpt_cuda_split.cpp) over each half of the sequences, around the half's
// reduction on the TP stream.
#include "model/cuda/gpt_cuda_state.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/qkv_layout.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

CudaGPT::RowSpan CudaGPT::whole_span(const DeviceMicrobatch& mb) const {
  const int64_t T = mb.B * mb.S;
  return {.first = 0, .rows = T, .seqs = mb.B, .positions = mb.positions, .piece_first = 0, .piece_rows = local_rows(T), .whole = true};
}

CudaGPT::RowSpan CudaGPT::half_span(const DeviceMicrobatch& mb, int64_t half) const {
  const int64_t rows = mb.B / 2 * mb.S;
  return {.first = half * rows, .rows = rows, .seqs = mb.B / 2, .positions = layer_positions(mb) + half * rows, .piece_first = half * piece(rows),
          .piece_rows = piece(rows), .whole = false};
}

// What runs over whole microbatches only (the split TP layers are not built with any of it: gpt_cuda.cpp).
bool CudaGPT::needs_whole_microbatches() const {
  const ModelDims& D = D_;
  return D.qk_norm || D.mla || kv_group_ || D.cp > 1 || doc_mask_ || D.attention_dropout > 0 || D.squared_relu || D.gelu_erf;
}

void CudaGPT::require_whole(int64_t l, const RowSpan& sp, const char* unit) const {
  if (sp.whole) return;
  if (needs_whole_microbatches() || fp8_layer(l) || layers_[static_cast<size_t>(l)].moe || defer_into_) {
    throw std::logic_error(std::string("CUDA model: ") + unit + " of layer " + std::to_string(l) + " over part of a microbatch with a feature that needs all of it");
  }
}

void CudaGPT::attention_forward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp) {
  require_whole(l, sp, "the attention block");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t o = sp.first, n = sp.rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq, Vd = W_.Vd, Od = W_.Od;
  const bool rope = D.rope_in(first_layer_ + l);  // (--no-rope-freq: not in every layer)
  if (D.mla) {
    mla_projections_forward(l, r, sp);
  } else {
    linear_forward(l, r, kLinearQkv, "fwd.gemm.qkv", n, h, Wq, r.xn1 + o * h, lw.qkv_w, w(lw.qkv_b), s.qkv + o * Wq);
  }
  if (D.mla) {
    // (the queries, keys and values are in r already)
  } else if (D.qk_norm) {  // split, the norm of every query and key head, then RoPE (as Megatron: norm before rotary)
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = r.q_pre, .k = r.k_pre, .v = r.v, .qkv = s.qkv, .positions = sp.positions,
                                                        .table = nullptr, .rows = n, .heads = D.nh_local, .groups = D.ng_local, .head_dim = D.d,
                                                        .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = r.q, .mean = r.qn_mean, .rstd = r.qn_rstd, .x = r.q_pre,
                                                   .delta = nullptr, .w = w(lw.qn_w), .b = w(lw.qn_b), .w_offset = norm_offset_, .rows = n * D.nh_local, .width = D.d,
                                                   .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = r.k, .mean = r.kn_mean, .rstd = r.kn_rstd, .x = r.k_pre,
                                                   .delta = nullptr, .w = w(lw.kn_w), .b = w(lw.kn_b), .w_offset = norm_offset_, .rows = n * D.ng_local, .width = D.d,
                                                   .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
    if (rope) {
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.q, sp.positions, rope_table_, n, D.nh_local, D.d, D.rot_dim, 1.0f, stream_, dt_, D.rotary_interleaved));
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.k, sp.positions, rope_table_, n, D.ng_local, D.d, D.rot_dim, 1.0f, stream_, dt_, D.rotary_interleaved));
    }
  } else if (!kv_group_) {
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = r.q + o * Hd, .k = r.k + o * KVd, .v = r.v + o * KVd, .qkv = s.qkv + o * Wq,
                                                        .positions = sp.positions, .table = rope ? rope_table_ : nullptr, .rows = n, .heads = D.nh_local,
                                                        .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  } else {  // the group's query heads, then this rank's nh_local of them
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = s.q_all, .k = r.k, .v = r.v, .qkv = s.qkv, .positions = sp.positions,
                                                        .table = rope ? rope_table_ : nullptr, .rows = n, .heads = D.qh_local,
                                                        .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
    MT_PROF("fwd.qkv_split_rope", copy_own_heads(r.q, s.q_all, n, false));
  }
  if (D.cp > 1 && D.cp_a2a) {
    a2a_attention_forward(r, mb);
  } else if (D.cp > 1) {
    ring_attention_forward(r, mb);
  } else {
    cuda::SdpaShape sh = attention_shape(mb);
    sh.B = sp.seqs;
    sh.window = D.window_in(first_layer_ + l) >= sh.S - 1 ? -1 : D.window_in(first_layer_ + l);  // (one spanning the sequence: none)
    const bf16* doc_bias = document_bias(mb);
    MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(sh, r.q + o * Hd, r.k + o * KVd, r.v + o * Vd, r.o + o * Od, r.stats + o * D.nh_local,
                                                                 stream_, doc_bias, attention_seed(mb, l), sink_logits(lw)));
  }
  // Row-parallel: the bias joins one rank's partial sum.
  linear_forward(l, r, kLinearProj, "fwd.gemm.proj", n, Od, h, r.o + o * Od, lw.proj_w, row_bias(lw.proj_b), s.delta + o * h);
}

void CudaGPT::mlp_forward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, bool with_output) {
  require_whole(l, sp, "the MLP block");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  if (lw.moe) {
    moe_forward(l, r, mb);
    return;
  }
  auto& lt = cuda::GemmLt::instance();
  const int64_t o = sp.first, n = sp.rows, h = D.h, F = W_.F, F1 = W_.F1;
  bool act_cast = false;  // (FP8 delayed scaling: SwiGLU wrote fc2's FP8 input itself)
  if (D.swiglu) {
    linear_forward(l, r, kLinearFc1, "fwd.gemm.fc1", n, h, F1, r.xn2 + o * h, lw.fc1_w, w(lw.fc1_b), r.fc1 + o * F1);
    // (the 16-bit output too where a 16-bit weight gradient reads it)
    if (fp8_fuses_swiglu(l)) {
      MT_PROF("fwd.activation", act_cast = cuda::fp8_swiglu_forward_cast(r.fc1, n, F, fp8_input_target(l, r, kLinearFc2), D.fp8_wgrad ? nullptr : r.act,
                                                                        stream_));
    }
    if (!act_cast && !r.act) throw std::logic_error("CUDA model: SwiGLU's fused FP8 cast does not take a " + std::to_string(n) + " x " + std::to_string(F) +
                                                    " activation, and its 16-bit output has no buffer");
    if (!act_cast) MT_PROF("fwd.activation", cuda::glu_forward_bf16(r.act + o * F, r.fc1 + o * F1, n, F, D.glu, stream_, dt_));
  } else if (fp8_layer(l) || D.squared_relu || D.gelu_erf) {  // (no GELU epilogue on the FP8 GEMM, nor in the erf form; squared ReLU has none)
    linear_forward(l, r, kLinearFc1, "fwd.gemm.fc1", n, h, F, r.xn2 + o * h, lw.fc1_w, w(lw.fc1_b), r.fc1 + o * F);
    if (D.squared_relu) MT_PROF("fwd.activation", cuda::squared_relu_forward_bf16(r.act + o * F, r.fc1 + o * F, n * F, stream_, dt_));
    else MT_PROF("fwd.activation", cuda::gelu_forward_bf16(r.act + o * F, r.fc1 + o * F, n * F, stream_, dt_, D.gelu_erf));
  } else {  // GELU in the GEMM's epilogue, its input kept for the backward
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, n, F, h, 1.0f, r.xn2 + o * h, h, w(lw.fc1_w), h, 0.0f, r.act + o * F, F, ab_, ab_, w(lw.fc1_b), stream_,
                                       {cuda::GemmEpilogue::kGeluAux, r.fc1 + o * F, F}));
  }
  if (!with_output) return;
  // (r.act is null only where SwiGLU's FP8 cast wrote fc2's input: whole spans, o = 0)
  linear_forward(l, r, kLinearFc2, "fwd.gemm.fc2", n, F, h, r.act ? r.act + o * F : nullptr, lw.fc2_w, row_bias(lw.fc2_b), s.delta + o * h, act_cast);
}

void CudaGPT::mlp_norm_forward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const bf16* sum, cuda::Partials parts,
                               cudaStream_t st) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t h = D.h;
  MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward({.sum_out = res_at(r.x_mid, p0 * h), .y = norm_out(r.xn2) + p0 * h, .mean = r.mean2 + p0,
                                                         .rstd = r.rstd2 + p0, .x = res_at(records_[static_cast<size_t>(l)]->x_in, p0 * h), .delta = sum,
                                                         .w = w(lw.ln2_w), .b = w(lw.ln2_b), .w_offset = norm_offset_, .rows = pr, .width = h, .eps = D.eps,
                                                         .rms = D.rms, .type = dt_, .res16 = res16_,
                                                         .dropout = drop(mb, attn_site(first_layer_ + l), row0(mb.B * mb.S) + p0), .parts = parts}, st));
}

void CudaGPT::input_norm_forward(int64_t l, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const bf16* sum, cuda::Partials parts, cudaStream_t st) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Record& r = act(l);
  const int64_t h = D.h;
  MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward({.sum_out = res_at(records_[static_cast<size_t>(l)]->x_in, p0 * h), .y = norm_out(r.xn1) + p0 * h,
                                                         .mean = r.mean1 + p0, .rstd = r.rstd1 + p0, .x = res_at(act(l - 1).x_mid, p0 * h), .delta = sum,
                                                         .w = w(lw.ln1_w), .b = w(lw.ln1_b), .w_offset = norm_offset_, .rows = pr, .width = h, .eps = D.eps,
                                                         .rms = D.rms, .type = dt_, .res16 = res16_,
                                                         .dropout = drop(mb, mlp_site(first_layer_ + l - 1), row0(mb.B * mb.S) + p0), .parts = parts}, st));
}

void CudaGPT::mlp_norm_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const bf16* sum, cuda::Partials parts,
                                cudaStream_t st) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t h = D.h;
  // (off the compute stream, away from the caching allocator: the kernel's partial sums in scratch of their own)
  MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add({.dres = s.dres + p0 * h, .dres16 = s.dres16 + p0 * h, .dw = g(lw.ln2_w), .db = g(lw.ln2_b),
                                                      .dy = sum, .x = res_at(r.x_mid, p0 * h), .mean = r.mean2 + p0, .rstd = r.rstd2 + p0,
                                                      .w = w(lw.ln2_w), .w_offset = norm_offset_, .rows = pr, .width = h, .rms = D.rms, .type = dt_,
                                                      .res16 = res16_, .dropout = drop(mb, attn_site(first_layer_ + l), row0(mb.B * mb.S) + p0),
                                                      .partials = st == stream_ ? nullptr : s.norm_part, .parts = parts}, st));
}

void CudaGPT::input_norm_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const bf16* sum, cuda::Partials parts,
                                  cudaStream_t st) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t h = D.h;
  const cuda::RowDropout* below = first_layer_ + l > 0 ? drop(mb, mlp_site(first_layer_ + l - 1), row0(mb.B * mb.S) + p0) : nullptr;
  MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add({.dres = s.dres + p0 * h, .dres16 = s.dres16 + p0 * h, .dw = g(lw.ln1_w), .db = g(lw.ln1_b),
                                                      .dy = sum, .x = res_at(records_[static_cast<size_t>(l)]->x_in, p0 * h), .mean = r.mean1 + p0,
                                                      .rstd = r.rstd1 + p0, .w = w(lw.ln1_w), .w_offset = norm_offset_, .rows = pr, .width = h, .rms = D.rms,
                                                      .type = dt_, .res16 = res16_, .dropout = below,
                                                      .partials = st == stream_ ? nullptr : s.norm_part, .parts = parts}, st));
}

void CudaGPT::mlp_backward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, const bf16* dy) {
  require_whole(l, sp, "the MLP block's backward");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  Slot* const defer = defer_into_;  // B only: the weight gradients' inputs saved for backward_weights
  if (lw.moe) {
    if (defer) throw std::logic_error("CUDA model: an MoE layer's weight gradients do not run apart yet");
    moe_backward(l, r, mb, dy);
    return;
  }
  auto& lt = cuda::GemmLt::instance();
  const int64_t o = sp.first, n = sp.rows, h = D.h, F = W_.F, F1 = W_.F1;
  // Row-parallel biases: under SP their gradient is this rank's rows' (summed over TP later), not all of dy's.
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  bf16* dfc1 = s.dfc1 + o * F1;
  if (D.swiglu) {
    linear_dgrad(l, r, kLinearFc2, "bwd.gemm.fc2_dgrad", n, F, h, dy, lw.fc2_w, s.dact + o * F);
  } else if (fp8_layer(l) || D.squared_relu || D.gelu_erf) {  // (no GELU epilogue on the FP8 GEMM, nor in the erf form; squared ReLU has none)
    linear_dgrad(l, r, kLinearFc2, "bwd.gemm.fc2_dgrad", n, F, h, dy, lw.fc2_w, s.dact + o * F);
    if (D.squared_relu) MT_PROF("bwd.activation", cuda::squared_relu_backward_bf16(dfc1, s.dact + o * F, r.fc1 + o * F, n * F, stream_, dt_));
    else MT_PROF("bwd.activation", cuda::gelu_backward_bf16(dfc1, s.dact + o * F, r.fc1 + o * F, n * F, stream_, dt_, D.gelu_erf));
  } else {  // the GELU backward in the epilogue: straight to d(fc1 output)
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, n, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, dfc1, F, ab_, ab_, nullptr, stream_,
                                             {cuda::GemmEpilogue::kDGelu, r.fc1 + o * F, F}));
  }
  if (defer) save_for_weights(defer->dy_mlp, l, dy, h, n);
  if (!defer) linear_wgrad(stream_, l, r, kLinearFc2, "bwd.gemm.fc2_wgrad", n, F, h, dy, r.act ? r.act + o * F : nullptr, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
  // (A row-parallel bias not from the epilogue takes this rank's rows: in the backward itself, deferred or not. Without the
  // epilogue the bias gradient kernel stays on the compute stream: its temporaries come from the caching allocator, which
  // assumes that stream.)
  if (!fuse_row && lw.fc2_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc2_b), s.dres16 + sp.piece_first * h, sp.piece_rows, h, stream_, dt_));
  // FP8 delayed scaling: SwiGLU's backward writes fc1's FP8 output gradient (and its transpose) itself where nothing
  // reads the 16-bit one (an FP8 weight gradient run now, no bias).
  bool dfc1_cast = false;
  if (D.swiglu && fp8_fuses_swiglu(l) && D.fp8_wgrad && !defer && lw.fc1_b < 0) {
    MT_PROF("bwd.activation", dfc1_cast = cuda::fp8_swiglu_backward_cast(s.dact, r.fc1, n, F, fp8_grad_target(l, kLinearFc1), stream_));
  }
  if (D.swiglu && !dfc1_cast) MT_PROF("bwd.activation", cuda::glu_backward_bf16(dfc1, s.dact + o * F, r.fc1 + o * F1, n, F, D.glu, stream_, dt_));
  linear_dgrad(l, r, kLinearFc1, "bwd.gemm.fc1_dgrad", n, h, F1, dfc1, lw.fc1_w, s.dxn + o * h, dfc1_cast);
  if (defer) {
    save_for_weights(defer->dfc1, l, s.dfc1, F1, n);
  } else if (!bgrad_epilogue_ && lw.fc1_b >= 0) {
    MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), dfc1, n, F1, stream_, dt_));
  }
}

void CudaGPT::mlp_fc1_wgrad(int64_t l, Record& r, const RowSpan& sp, cudaStream_t ws) {
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t o = sp.first, h = D_.h, F1 = W_.F1;
  linear_wgrad(ws, l, r, kLinearFc1, "bwd.gemm.fc1_wgrad", sp.rows, h, F1, s_->dfc1 + o * F1, r.xn2 + o * h, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
}

void CudaGPT::attention_backward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, const bf16* dy, bool proj_wgrad) {
  require_whole(l, sp, "the attention block's backward");
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t o = sp.first, n = sp.rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq, Vd = W_.Vd, Od = W_.Od;
  const bool rope = D.rope_in(first_layer_ + l);
  Slot* const defer = defer_into_;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  linear_dgrad(l, r, kLinearProj, "bwd.gemm.proj_dgrad", n, Od, h, dy, lw.proj_w, s.d_o + o * Od);
  if (defer) save_for_weights(defer->dy_attn, l, dy, h, n);
  if (!defer && proj_wgrad) linear_wgrad(stream_, l, r, kLinearProj, "bwd.gemm.proj_wgrad", n, Od, h, dy, r.o + o * Od, lw.proj_w, fuse_row ? lw.proj_b : -1);
  if (!fuse_row && lw.proj_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.proj_b), s.dres16 + sp.piece_first * h, sp.piece_rows, h, stream_, dt_));
  if (D.mla && r.mla_k_pe) mla_up_forward(l, r, sp, r.mla_k_pe);  // (--recompute-modules mla_up_proj: the attention's inputs again)
  if (D.cp > 1 && D.cp_a2a) {
    a2a_attention_backward(r, mb);
  } else if (D.cp > 1) {
    ring_attention_backward(r, mb);
  } else {
    cuda::SdpaShape sh = attention_shape(mb);
    sh.B = sp.seqs;
    sh.window = D.window_in(first_layer_ + l) >= sh.S - 1 ? -1 : D.window_in(first_layer_ + l);  // (one spanning the sequence: none)
    const bf16* doc_bias = document_bias(mb);
    const float* sink = sink_logits(lw);
    MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward(sh, r.q + o * Hd, r.k + o * KVd, r.v + o * Vd, r.o + o * Od, s.d_o + o * Od,
                                                                  r.stats + o * D.nh_local, s.dq + o * Hd, s.dk + o * KVd, s.dv + o * Vd, stream_, doc_bias,
                                                                  attention_seed(mb, l), sink, g(lw.sink)));
  }
  if (D.mla) {  // (every projection's input and weight gradients, there)
    mla_projections_backward(l, r, sp);
    return;
  }
  if (D.qk_norm) {  // RoPE undone, then the norms' backward (the residual-gradient slot as zeroed scratch)
    if (rope) {
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dq, sp.positions, rope_table_, n, D.nh_local, D.d, D.rot_dim, -1.0f, stream_, dt_, D.rotary_interleaved));
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dk, sp.positions, rope_table_, n, D.ng_local, D.d, D.rot_dim, -1.0f, stream_, dt_, D.rotary_interleaved));
    }
    const int64_t Tq = n * D.nh_local, Tk = n * D.ng_local;
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.qk_tmp, 0, static_cast<size_t>(Tq * D.d) * 4, stream_)));
    MT_PROF("bwd.qk_norm", cuda::norm_backward_add({.dres = s.qk_tmp, .dres16 = s.dq_pre, .dw = g(lw.qn_w),
                                                    .db = lw.qn_b >= 0 ? g(lw.qn_b) : nullptr, .dy = s.dq, .x = r.q_pre, .mean = r.qn_mean,
                                                    .rstd = r.qn_rstd, .w = w(lw.qn_w), .w_offset = norm_offset_, .rows = Tq, .width = D.d, .rms = D.rms, .type = dt_,
                                                    .res16 = true}, stream_));
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.qk_tmp, 0, static_cast<size_t>(Tk * D.d) * 4, stream_)));
    MT_PROF("bwd.qk_norm", cuda::norm_backward_add({.dres = s.qk_tmp, .dres16 = s.dk_pre, .dw = g(lw.kn_w),
                                                    .db = lw.kn_b >= 0 ? g(lw.kn_b) : nullptr, .dy = s.dk, .x = r.k_pre, .mean = r.kn_mean,
                                                    .rstd = r.kn_rstd, .w = w(lw.kn_w), .w_offset = norm_offset_, .rows = Tk, .width = D.d, .rms = D.rms, .type = dt_,
                                                    .res16 = true}, stream_));
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv, .dq = s.dq_pre, .dk = s.dk_pre, .dv = s.dv,
                                                                 .positions = sp.positions, .table = nullptr, .rows = n, .heads = D.nh_local,
                                                                 .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
    // Each TP rank's heads add to the shared norm weights: summed over TP here (under SP with the layer's
    // other replicated parameters).
    if (tp_ && !sp_ && final_backward_) {
      tp_->group_start();
      for (int64_t off : {lw.qn_w, lw.qn_b, lw.kn_w, lw.kn_b}) {
        if (off >= 0) tp_->all_reduce_on(g(off), D.d, WireType::kF32, ReduceOp::kSum, stream_);
      }
      MT_PROF("tp.qk_norm_grads", tp_->group_end());
    }
  } else if (!kv_group_) {
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv + o * Wq, .dq = s.dq + o * Hd, .dk = s.dk + o * KVd, .dv = s.dv + o * KVd,
                                                                 .positions = sp.positions, .table = rope ? rope_table_ : nullptr, .rows = n,
                                                                 .heads = D.nh_local, .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_,
                                                                 .interleaved = D.rotary_interleaved}, stream_));
  } else {  // zero for the group's query heads other ranks own: their gradients arrive in the replica sum
    MT_PROF("bwd.qkv_merge_rope", copy_own_heads(s.dq, s.q_all, n, true));
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv, .dq = s.q_all, .dk = s.dk, .dv = s.dv, .positions = sp.positions,
                                                                 .table = rope ? rope_table_ : nullptr, .rows = n, .heads = D.qh_local,
                                                                 .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  }
  linear_dgrad(l, r, kLinearQkv, "bwd.gemm.qkv_dgrad", n, h, Wq, s.qkv + o * Wq, lw.qkv_w, s.dxn + o * h);
  if (defer) {
    save_for_weights(defer->dqkv, l, s.qkv, Wq, n);
  } else if (!bgrad_epilogue_ && lw.qkv_b >= 0) {
    MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), s.qkv + o * Wq, n, Wq, stream_, dt_));
  }
}

void CudaGPT::attention_wgrads(int64_t l, Record& r, const RowSpan& sp, const bf16* dy, bool proj, cudaStream_t ws) {
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t o = sp.first, n = sp.rows, h = D_.h, Od = W_.Od, Wq = W_.Wq;
  if (proj) {
    const bool fuse_row = bgrad_epilogue_ && !sp_;
    linear_wgrad(ws, l, r, kLinearProj, "bwd.gemm.proj_wgrad", n, Od, h, dy, r.o + o * Od, lw.proj_w, fuse_row ? lw.proj_b : -1);
    MT_CUDA_CHECK(cudaEventRecord(proj_done_ev_, ws));
  }
  if (D_.mla) return;  // (multi-latent attention's projections took theirs in the backward)
  linear_wgrad(ws, l, r, kLinearQkv, "bwd.gemm.qkv_wgrad", n, h, Wq, s_->qkv + o * Wq, r.xn1 + o * h, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
}

}  // namespace mt
