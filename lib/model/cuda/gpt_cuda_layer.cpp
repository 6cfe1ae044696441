// gpt_cuda_layer.cpp: one transformer layer's forward (keeping what its backward reads, or nothing under
// recompute) and backward on the CUDA kernels, over the microbatch's T rows (Tl in the residual stream).
#include "model/cuda/gpt_cuda_state.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/cross_entropy_bf16.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_bf16.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/qkv_layout.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

// From r's xn1 (the normalised input, all T rows) to the MLP output of this rank's rows; r.x_mid and the
// rest saved in r.
const bf16* CudaGPT::layer_forward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  const int64_t Hd = W_.Hd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  const cuda::SdpaShape sh = attention_shape(mb);
  linear_forward(l, r, kLinearQkv, "fwd.gemm.qkv", T, h, Wq, r.xn1, lw.qkv_w, w(lw.qkv_b), s.qkv);
  if (D.qk_norm) {  // split, the norm of every query and key head, then RoPE (as Megatron: norm before rotary)
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = r.q_pre, .k = r.k_pre, .v = r.v, .qkv = s.qkv, .positions = mb.positions,
                                                        .table = nullptr, .rows = T, .heads = D.nh_local, .groups = D.ng_local, .head_dim = D.d,
                                                        .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = r.q, .mean = r.qn_mean, .rstd = r.qn_rstd, .x = r.q_pre,
                                                   .delta = nullptr, .w = w(lw.qn_w), .b = w(lw.qn_b), .w_offset = norm_offset_, .rows = T * D.nh_local, .width = D.d,
                                                   .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = r.k, .mean = r.kn_mean, .rstd = r.kn_rstd, .x = r.k_pre,
                                                   .delta = nullptr, .w = w(lw.kn_w), .b = w(lw.kn_b), .w_offset = norm_offset_, .rows = T * D.ng_local, .width = D.d,
                                                   .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = true}, stream_));
    if (D.rope) {
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.q, mb.positions, rope_table_, T, D.nh_local, D.d, D.rot_dim, 1.0f, stream_, dt_, D.rotary_interleaved));
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.k, mb.positions, rope_table_, T, D.ng_local, D.d, D.rot_dim, 1.0f, stream_, dt_, D.rotary_interleaved));
    }
  } else if (!kv_group_) {
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = r.q, .k = r.k, .v = r.v, .qkv = s.qkv, .positions = mb.positions,
                                                        .table = D.rope ? rope_table_ : nullptr, .rows = T, .heads = D.nh_local,
                                                        .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  } else {  // the group's query heads, then this rank's nh_local of them
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = s.q_all, .k = r.k, .v = r.v, .qkv = s.qkv, .positions = mb.positions,
                                                        .table = D.rope ? rope_table_ : nullptr, .rows = T, .heads = D.qh_local,
                                                        .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
    MT_PROF("fwd.qkv_split_rope", copy_own_heads(r.q, s.q_all, T, false));
  }
  if (D.cp > 1 && D.cp_a2a) {
    a2a_attention_forward(r, mb);
  } else if (D.cp > 1) {
    ring_attention_forward(r, mb);
  } else {
    const bf16* doc_bias = document_bias(mb);
    MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(sh, r.q, r.k, r.v, r.o, r.stats, stream_, doc_bias, attention_seed(mb, l)));
  }
  // Row-parallel: the bias joins one rank's partial sum.
  linear_forward(l, r, kLinearProj, "fwd.gemm.proj", T, Hd, h, r.o, lw.proj_w, row_bias(lw.proj_b), s.delta);
  const bf16* attn = combine_rows(s.delta, s.delta_l, T);
  MT_PROF("fwd.add_norm", cuda::add_norm_forward({.sum_out = r.x_mid, .y = norm_out(r.xn2), .mean = r.mean2, .rstd = r.rstd2, .x = x_in,
                                                  .delta = attn, .w = w(lw.ln2_w), .b = w(lw.ln2_b), .w_offset = norm_offset_, .rows = Tl, .width = h, .eps = D.eps,
                                                  .rms = D.rms, .type = dt_, .res16 = res16_, .dropout = drop(mb, attn_site(first_layer_ + l), row0(T))}, stream_));
  gather_rows(s.xn_l, r.xn2, T);
  if (lw.moe) {
    moe_forward(l, r, mb);
    return combine_rows(s.delta, s.delta_l, T);
  }
  bool act_cast = false;  // (FP8 delayed scaling: SwiGLU wrote fc2's FP8 input itself)
  if (D.swiglu) {
    linear_forward(l, r, kLinearFc1, "fwd.gemm.fc1", T, h, F1, r.xn2, lw.fc1_w, w(lw.fc1_b), r.fc1);
    // (the 16-bit output too where a 16-bit weight gradient reads it)
    if (fp8_fuses_swiglu(l)) {
      MT_PROF("fwd.activation", act_cast = cuda::fp8_swiglu_forward_cast(r.fc1, T, F, fp8_input_target(l, r, kLinearFc2), D.fp8_wgrad ? nullptr : r.act,
                                                                        stream_));
    }
    if (!act_cast && !r.act) throw std::logic_error("CUDA model: SwiGLU's fused FP8 cast does not take a " + std::to_string(T) + " x " + std::to_string(F) +
                                                    " activation, and its 16-bit output has no buffer");
    if (!act_cast) MT_PROF("fwd.activation", cuda::swiglu_forward_bf16(r.act, r.fc1, T, F, stream_, dt_));
  } else if (fp8_layer(l) || D.squared_relu) {  // (no GELU epilogue on the FP8 GEMM; squared ReLU has none)
    linear_forward(l, r, kLinearFc1, "fwd.gemm.fc1", T, h, F, r.xn2, lw.fc1_w, w(lw.fc1_b), r.fc1);
    if (D.squared_relu) MT_PROF("fwd.activation", cuda::squared_relu_forward_bf16(r.act, r.fc1, T * F, stream_, dt_));
    else MT_PROF("fwd.activation", cuda::gelu_forward_bf16(r.act, r.fc1, T * F, stream_, dt_));
  } else {  // GELU in the GEMM's epilogue, its input kept for the backward
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, T, F, h, 1.0f, r.xn2, h, w(lw.fc1_w), h, 0.0f, r.act, F, ab_, ab_, w(lw.fc1_b), stream_,
                                       {cuda::GemmEpilogue::kGeluAux, r.fc1, F}));
  }
  linear_forward(l, r, kLinearFc2, "fwd.gemm.fc2", T, F, h, r.act, lw.fc2_w, row_bias(lw.fc2_b), s.delta, act_cast);
  return combine_rows(s.delta, s.delta_l, T);
}

// s_->dres holds d(layer output) on entry and d(layer input) on exit (s_->dres16 its bf16 copy), this
// rank's rows.
void CudaGPT::layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  const int64_t Hd = W_.Hd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  // MLP
  const bf16* dy = gather_rows(s.dres16, s.dres16_full, T);
  Slot* const defer = defer_into_;  // B only: the weight gradients' inputs saved for backward_weights
  // Row-parallel biases: under SP their gradient is this rank's rows' (summed over TP later), not all of dy's.
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  // Without the epilogue the bias gradient kernel stays on the compute stream (its temporaries come from the
  // caching allocator, which assumes that stream).
  cudaStream_t ws = stream_;
  if (lw.moe) {
    if (defer) throw std::logic_error("CUDA model: an MoE layer's weight gradients do not run apart yet");
    moe_backward(l, r, mb, dy);
  } else {
  if (D.swiglu) {
    linear_dgrad(l, r, kLinearFc2, "bwd.gemm.fc2_dgrad", T, F, h, dy, lw.fc2_w, s.dact);
  } else if (fp8_layer(l) || D.squared_relu) {  // (no GELU epilogue on the FP8 GEMM; squared ReLU has none)
    linear_dgrad(l, r, kLinearFc2, "bwd.gemm.fc2_dgrad", T, F, h, dy, lw.fc2_w, s.dact);
    if (D.squared_relu) MT_PROF("bwd.activation", cuda::squared_relu_backward_bf16(s.dfc1, s.dact, r.fc1, T * F, stream_, dt_));
    else MT_PROF("bwd.activation", cuda::gelu_backward_bf16(s.dfc1, s.dact, r.fc1, T * F, stream_, dt_));
  } else {  // the GELU backward in the epilogue: straight to d(fc1 output)
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, T, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, s.dfc1, F, ab_, ab_, nullptr, stream_,
                                             {cuda::GemmEpilogue::kDGelu, r.fc1, F}));
  }
  if (defer) save_for_weights(defer->dy_mlp, l, dy, h, T);
  if (!defer) linear_wgrad(stream_, l, r, kLinearFc2, "bwd.gemm.fc2_wgrad", T, F, h, dy, r.act, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
  // (A row-parallel bias not from the epilogue takes this rank's rows: in the backward itself, deferred or not.)
  if (!fuse_row && lw.fc2_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc2_b), s.dres16, Tl, h, stream_, dt_));
  // FP8 delayed scaling: SwiGLU's backward writes fc1's FP8 output gradient (and its transpose) itself where nothing
  // reads the 16-bit one (an FP8 weight gradient run now, no bias).
  bool dfc1_cast = false;
  if (D.swiglu && fp8_fuses_swiglu(l) && D.fp8_wgrad && !defer && lw.fc1_b < 0) {
    MT_PROF("bwd.activation", dfc1_cast = cuda::fp8_swiglu_backward_cast(s.dact, r.fc1, T, F, fp8_grad_target(l, kLinearFc1), stream_));
  }
  if (D.swiglu && !dfc1_cast) MT_PROF("bwd.activation", cuda::swiglu_backward_bf16(s.dfc1, s.dact, r.fc1, T, F, stream_, dt_));
  linear_dgrad(l, r, kLinearFc1, "bwd.gemm.fc1_dgrad", T, h, F1, s.dfc1, lw.fc1_w, s.dxn, dfc1_cast);
  if (defer) {
    save_for_weights(defer->dfc1, l, s.dfc1, F1, T);
  } else {
    if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), s.dfc1, T, F1, stream_, dt_));
    ws = fork_wgrad();
    linear_wgrad(ws, l, r, kLinearFc1, "bwd.gemm.fc1_wgrad", T, h, F1, s.dfc1, r.xn2, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
  }
  }
  const bf16* dmlp = combine_rows(s.dxn, s.dxn_l, T);
  MT_PROF("bwd.norm", cuda::norm_backward_add({.dres = s.dres, .dres16 = s.dres16, .dw = g(lw.ln2_w), .db = g(lw.ln2_b), .dy = dmlp, .x = r.x_mid,
                                               .mean = r.mean2, .rstd = r.rstd2, .w = w(lw.ln2_w), .w_offset = norm_offset_, .rows = Tl, .width = h, .rms = D.rms,
                                               .type = dt_, .res16 = res16_, .dropout = drop(mb, attn_site(first_layer_ + l), row0(T))}, stream_));
  // Attention
  dy = gather_rows(s.dres16, s.dres16_full, T);
  linear_dgrad(l, r, kLinearProj, "bwd.gemm.proj_dgrad", T, Hd, h, dy, lw.proj_w, s.d_o);
  // Under TP the projection's weight gradient waits for the side stream beside the QKV dgrad's collective,
  // which is longer than the QKV weight gradient alone: off the critical path (its dy is read before the
  // norm's backward below overwrites it).
  const bool defer_proj = wgrad_stream_ != nullptr;
  if (defer) save_for_weights(defer->dy_attn, l, dy, h, T);
  if (!defer && !defer_proj) linear_wgrad(stream_, l, r, kLinearProj, "bwd.gemm.proj_wgrad", T, Hd, h, dy, r.o, lw.proj_w, fuse_row ? lw.proj_b : -1);
  if (!fuse_row && lw.proj_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.proj_b), s.dres16, Tl, h, stream_, dt_));
  if (D.cp > 1 && D.cp_a2a) {
    a2a_attention_backward(r, mb);
  } else if (D.cp > 1) {
    ring_attention_backward(r, mb);
  } else {
    const bf16* doc_bias = document_bias(mb);
    MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward(attention_shape(mb), r.q, r.k, r.v, r.o, s.d_o, r.stats, s.dq, s.dk, s.dv, stream_,
                                                                  doc_bias, attention_seed(mb, l)));
  }
  if (D.qk_norm) {  // RoPE undone, then the norms' backward (the residual-gradient slot as zeroed scratch)
    if (D.rope) {
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dq, mb.positions, rope_table_, T, D.nh_local, D.d, D.rot_dim, -1.0f, stream_, dt_, D.rotary_interleaved));
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dk, mb.positions, rope_table_, T, D.ng_local, D.d, D.rot_dim, -1.0f, stream_, dt_, D.rotary_interleaved));
    }
    const int64_t Tq = T * D.nh_local, Tk = T * D.ng_local;
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
                                                                 .positions = mb.positions, .table = nullptr, .rows = T, .heads = D.nh_local,
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
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv, .dq = s.dq, .dk = s.dk, .dv = s.dv, .positions = mb.positions,
                                                                 .table = D.rope ? rope_table_ : nullptr, .rows = T, .heads = D.nh_local,
                                                                 .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  } else {  // zero for the group's query heads other ranks own: their gradients arrive in the replica sum
    MT_PROF("bwd.qkv_merge_rope", copy_own_heads(s.dq, s.q_all, T, true));
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv, .dq = s.q_all, .dk = s.dk, .dv = s.dv, .positions = mb.positions,
                                                                 .table = D.rope ? rope_table_ : nullptr, .rows = T, .heads = D.qh_local,
                                                                 .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  }
  linear_dgrad(l, r, kLinearQkv, "bwd.gemm.qkv_dgrad", T, h, Wq, s.qkv, lw.qkv_w, s.dxn);
  if (defer) {
    save_for_weights(defer->dqkv, l, s.qkv, Wq, T);
  } else {
    if (!bgrad_epilogue_ && lw.qkv_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), s.qkv, T, Wq, stream_, dt_));
    ws = fork_wgrad();
    if (defer_proj) {
      linear_wgrad(ws, l, r, kLinearProj, "bwd.gemm.proj_wgrad", T, Hd, h, dy, r.o, lw.proj_w, fuse_row ? lw.proj_b : -1);
      MT_CUDA_CHECK(cudaEventRecord(proj_done_ev_, ws));
    }
    linear_wgrad(ws, l, r, kLinearQkv, "bwd.gemm.qkv_wgrad", T, h, Wq, s.qkv, r.xn1, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
  }
  const bf16* dattn = combine_rows(s.dxn, s.dxn_l, T);
  if (defer_proj && !sp_ && !defer) MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, proj_done_ev_, 0));  // under SP dy is dres16_full
  MT_PROF("bwd.norm", cuda::norm_backward_add({.dres = s.dres, .dres16 = s.dres16, .dw = g(lw.ln1_w), .db = g(lw.ln1_b), .dy = dattn, .x = x_in,
                                               .mean = r.mean1, .rstd = r.rstd1, .w = w(lw.ln1_w), .w_offset = norm_offset_, .rows = Tl, .width = h, .rms = D.rms,
                                               .type = dt_, .res16 = res16_, .dropout = first_layer_ + l > 0 ? drop(mb, mlp_site(first_layer_ + l - 1), row0(T)) : nullptr}, stream_));
  sum_replicated_grads(layer_replicated_[static_cast<size_t>(l)], stream_);
  // The side stream's GEMMs read this layer's saved inputs and s_->dfc1 / s_->qkv, which the next layer
  // (or its recompute) overwrites, and their gradients must be final before the grads-ready hook.
  MT_PROF("tp.wgrad_join", join_wgrad());
  if (kv_group_ && final_backward_ && !defer) {  // (deferred: after the QKV weight gradient, in backward_weights)
    // Every replica of the group's QKV block gets the sum: its own query heads' rows from their owner, and
    // the K/V rows from all the group's query heads.
    kv_group_->group_start();
    kv_group_->all_reduce_on(g(lw.qkv_w), static_cast<int64_t>(Wq) * h, WireType::kF32, ReduceOp::kSum, stream_);
    if (lw.qkv_b >= 0) kv_group_->all_reduce_on(g(lw.qkv_b), Wq, WireType::kF32, ReduceOp::kSum, stream_);
    MT_PROF("tp.kv_replica_grads", kv_group_->group_end());
  }
}

void CudaGPT::save_for_weights(std::vector<bf16*>& into, int64_t l, const bf16* from, int64_t width, int64_t T) {
  if (into.empty()) into.assign(static_cast<size_t>(L_), nullptr);
  bf16*& buf = into[static_cast<size_t>(l)];
  const size_t bytes = static_cast<size_t>(T_max_ * width) * 2;
  if (!buf) buf = static_cast<bf16*>(alloc(bytes));  // the slot's first deferral: kept for the later ones
  MT_PROF("bwd.save_for_weights", MT_CUDA_CHECK(cudaMemcpyAsync(buf, from, static_cast<size_t>(T * width) * 2, cudaMemcpyDeviceToDevice, stream_)));
}

// W of a deferred backward: each layer's weight gradients (and biases') from the saved output gradients and
// the slot's activations, the grads-ready hook after each layer as the plain backward calls it.
void CudaGPT::backward_weights(const DeviceMicrobatch& mb, int64_t slot) {
  activate(slot);
  Slot& sl = slots_[static_cast<size_t>(slot)];
  if (!sl.weights_due) throw std::logic_error("CUDA model: weight gradients of slot " + std::to_string(slot) + " without its deferred backward");
  const int64_t T = mb.B * mb.S, h = D_.h, Hd = W_.Hd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  for (int64_t l = L_ - 1; l >= 0; --l) {
    const auto k = static_cast<size_t>(l);
    const LayerW& lw = layers_[k];
    Record& r = act(l);
    linear_wgrad(stream_, l, r, kLinearFc2, "bwd.gemm.fc2_wgrad", T, F, h, sl.dy_mlp[k], r.act, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
    if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), sl.dfc1[k], T, F1, stream_, dt_));
    linear_wgrad(stream_, l, r, kLinearFc1, "bwd.gemm.fc1_wgrad", T, h, F1, sl.dfc1[k], r.xn2, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
    linear_wgrad(stream_, l, r, kLinearProj, "bwd.gemm.proj_wgrad", T, Hd, h, sl.dy_attn[k], r.o, lw.proj_w, fuse_row ? lw.proj_b : -1);
    if (!bgrad_epilogue_ && lw.qkv_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), sl.dqkv[k], T, Wq, stream_, dt_));
    linear_wgrad(stream_, l, r, kLinearQkv, "bwd.gemm.qkv_wgrad", T, h, Wq, sl.dqkv[k], r.xn1, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
    if (kv_group_ && final_backward_) {  // every replica of the group's QKV block gets the sum (as the fused backward)
      kv_group_->group_start();
      kv_group_->all_reduce_on(g(lw.qkv_w), static_cast<int64_t>(Wq) * h, WireType::kF32, ReduceOp::kSum, stream_);
      if (lw.qkv_b >= 0) kv_group_->all_reduce_on(g(lw.qkv_b), Wq, WireType::kF32, ReduceOp::kSum, stream_);
      MT_PROF("tp.kv_replica_grads", kv_group_->group_end());
    }
    if (final_backward_ && grads_ready_) grads_ready_(layer_start_[k]);
  }
  if (final_backward_ && grads_ready_) grads_ready_(pre_ ? 0 : layer_start_[0]);
  if (final_backward_) f8_weights_due_ = true;  // (FP8: the next iteration casts the weights anew)
  sl.weights_due = false;
}

}  // namespace mt
