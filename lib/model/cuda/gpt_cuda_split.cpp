// gpt_cuda_split.cpp: under tensor parallelism, every layer's forward and backward as two halves of the
// microbatch interleaved block by block, each half's row-parallel reductions (and under SP the norms and
// gathers around them) on the TP stream beside the other half's compute.
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

void CudaGPT::reduce_half(int64_t half, int64_t rows, bf16* base, bf16* local, const SumConsumer& then) {
  MT_CUDA_CHECK(cudaEventRecord(ready_ev_[half], stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(tp_stream_, ready_ev_[half], 0));
  bf16* data = base + half * rows * D_.h;
  const int64_t pr = piece(rows);
  const bf16* sum = data;
  cuda::Partials parts;
  if (all_to_all_ && then) {
    bf16* got = s_->parts + half * rows * D_.h;
    MT_PROF_ON(tp_stream_, "tp.all_to_all", tp_->all_to_all_on(data, got, pr * D_.h, wire_, tp_stream_));
    sum = got;
    parts = {static_cast<int>(tp_size_), pr * D_.h};
  } else if (sp_) {
    bf16* mine = local + half * pr * D_.h;
    MT_PROF_ON(tp_stream_, "tp.reduce_scatter", tp_->reduce_scatter_on(data, mine, pr * D_.h, wire_, tp_stream_));
    sum = mine;
  } else {
    MT_PROF_ON(tp_stream_, "tp.all_reduce", tp_->all_reduce_on(data, rows * D_.h, wire_, ReduceOp::kSum, tp_stream_));
  }
  if (then) then(tp_stream_, sum, parts);
  MT_CUDA_CHECK(cudaEventRecord(reduced_ev_[half], tp_stream_));
}

void CudaGPT::gather_half(int64_t half, int64_t rows, const bf16* local, bf16* full, cudaStream_t st) {
  const int64_t pr = piece(rows);
  MT_PROF_ON(st, "tp.all_gather", tp_->all_gather_on(local + half * pr * D_.h, full + half * rows * D_.h, pr * D_.h, wire_, st));
}

const int32_t* CudaGPT::layer_positions(const DeviceMicrobatch& mb) const { return s_->half_pos ? s_->half_pos : mb.positions; }

void CudaGPT::wait_reduced(int64_t half) { MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, reduced_ev_[half], 0)); }

void CudaGPT::wait_tp_stream() {
  MT_CUDA_CHECK(cudaEventRecord(tp_done_ev_, tp_stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, tp_done_ev_, 0));
}

// Half `half` of layer l's attention block: QKV (from the input norm the previous layer's MLP half queued on
// tp_stream_), attention and the projection, whose all-reduce and the MLP's input norm are left running.
void CudaGPT::attention_half(int64_t l, int64_t half, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t Bh = mb.B / 2, rows = Bh * mb.S, r0 = half * rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq;
  Record& r = act(l);
  if (l > 0) wait_reduced(half);  // the previous layer's MLP output reduced and this layer's input norm taken
  MT_PROF("fwd.gemm.qkv", lt.gemm_ex(false, true, rows, Wq, h, 1.0f, r.xn1 + r0 * h, h, w(lw.qkv_w), h, 0.0f, s.qkv + r0 * Wq, Wq, ab_, ab_,
                                     w(lw.qkv_b), stream_));
  MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope({.q = r.q + r0 * Hd, .k = r.k + r0 * KVd, .v = r.v + r0 * KVd, .qkv = s.qkv + r0 * Wq,
                                                      .positions = layer_positions(mb) + r0, .table = D.rope ? rope_table_ : nullptr, .rows = rows,
                                                      .heads = D.nh_local, .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  const cuda::SdpaShape sh{Bh, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
  MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(sh, r.q + r0 * Hd, r.k + r0 * KVd, r.v + r0 * KVd, r.o + r0 * Hd,
                                                               r.stats + half * Bh * D.nh_local * mb.S, stream_));
  MT_PROF("fwd.gemm.proj", lt.gemm_ex(false, true, rows, h, Hd, 1.0f, r.o + r0 * Hd, Hd, w(lw.proj_w), Hd, 0.0f, s.delta + r0 * h, h, ab_, ab_,
                                      row_bias(lw.proj_b), stream_));
  // The MLP's input norm of these rows follows the reduction on the TP stream (the other half's work runs
  // on the compute stream meanwhile); under SP on this rank's piece, then gathered.
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  const int64_t pr = piece(rows), p0 = half * pr;
  bf16* xn = sp_ ? s.xn_l : r.xn2;
  reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward({.sum_out = res_at(r.x_mid, p0 * h), .y = xn + p0 * h, .mean = r.mean2 + p0,
                                                           .rstd = r.rstd2 + p0, .x = res_at(x_in, p0 * h), .delta = sum, .w = w(lw.ln2_w),
                                                           .b = w(lw.ln2_b), .w_offset = norm_offset_, .rows = pr, .width = h, .eps = D.eps, .rms = D.rms, .type = dt_,
                                                           .res16 = res16_, .dropout = drop(mb, attn_site(first_layer_ + l), row0(mb.B * mb.S) + p0),
                                                           .parts = parts}, st));
    if (sp_) gather_half(half, rows, s.xn_l, r.xn2, st);
  });
}

// Half `half` of layer l's MLP block: fc1 (from the norm queued behind the attention's all-reduce), the
// activation and fc2, whose all-reduce and the next layer's input norm are left running.
void CudaGPT::mlp_half(int64_t l, int64_t half, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t rows = mb.B / 2 * mb.S, r0 = half * rows, h = D.h, F = W_.F, F1 = W_.F1;
  Record& r = act(l);
  wait_reduced(half);  // the attention output reduced and the MLP's input norm taken
  if (D.swiglu) {
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, rows, F1, h, 1.0f, r.xn2 + r0 * h, h, w(lw.fc1_w), h, 0.0f, r.fc1 + r0 * F1, F1, ab_, ab_,
                                       w(lw.fc1_b), stream_));
    MT_PROF("fwd.activation", cuda::swiglu_forward_bf16(r.act + r0 * F, r.fc1 + r0 * F1, rows, F, stream_, dt_));
  } else {
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, rows, F, h, 1.0f, r.xn2 + r0 * h, h, w(lw.fc1_w), h, 0.0f, r.act + r0 * F, F, ab_, ab_,
                                       w(lw.fc1_b), stream_, {cuda::GemmEpilogue::kGeluAux, r.fc1 + r0 * F, F}));
  }
  MT_PROF("fwd.gemm.fc2", lt.gemm_ex(false, true, rows, h, F, 1.0f, r.act + r0 * F, F, w(lw.fc2_w), F, 0.0f, s.delta + r0 * h, h, ab_, ab_,
                                     row_bias(lw.fc2_b), stream_));
  if (l + 1 == L_) {  // the final norm runs after both halves, on the compute stream
    reduce_half(half, rows, s.delta, s.delta_l, nullptr);
    return;
  }
  // The next layer's input norm of these rows follows the reduction on the TP stream (under SP on this
  // rank's piece, then gathered).
  const LayerW& nw = layers_[static_cast<size_t>(l + 1)];
  Record& n = act(l + 1);
  const int64_t pr = piece(rows), p0 = half * pr;
  bf16* xn = sp_ ? s.xn_l : n.xn1;
  reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward({.sum_out = res_at(records_[static_cast<size_t>(l + 1)]->x_in, p0 * h), .y = xn + p0 * h,
                                                           .mean = n.mean1 + p0, .rstd = n.rstd1 + p0, .x = res_at(r.x_mid, p0 * h), .delta = sum,
                                                           .w = w(nw.ln1_w), .b = w(nw.ln1_b), .w_offset = norm_offset_, .rows = pr, .width = h, .eps = D.eps, .rms = D.rms,
                                                           .type = dt_, .res16 = res16_, .dropout = drop(mb, mlp_site(first_layer_ + l), row0(mb.B * mb.S) + p0),
                                                           .parts = parts}, st));
    if (sp_) gather_half(half, rows, s.xn_l, n.xn1, st);
  });
}

// Every reduction goes through tp_stream_ in the order issued here, which is the same on every TP rank;
// collectives on the compute stream before (the embedding's) and after (the loss's) are ordered against
// them by the events.
void CudaGPT::split_layers_forward(const DeviceMicrobatch& mb) {
  for (int64_t l = 0; l < L_; ++l) {
    attention_half(l, 0, mb);
    attention_half(l, 1, mb);
    // The MLP halves' reductions are followed by the next layer's input norm on the TP stream, which reads
    // that layer's weights: the compute stream waits for them first (the TP stream follows it).
    if (l + 1 < L_) need_params(layer_end_[static_cast<size_t>(l + 1)]);
    mlp_half(l, 0, mb);
    mlp_half(l, 1, mb);
  }
  wait_reduced(0);
  wait_reduced(1);
}

// The split TP backward (with the split forward): each layer's MLP and attention blocks as two halves of
// the micro batch's sequences; a half's input-gradient all-reduce and the norm backward that consumes it run
// on tp_stream_ while the compute stream runs the other half's GEMMs and attention. The weight gradients
// accumulate half by half. s_->dres / dres16 as in layer_backward.
void CudaGPT::split_layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  mlp_backward_half(l, 0, r, mb);
  mlp_backward_half(l, 1, r, mb);
  attention_backward_half(l, 0, r, mb);
  attention_backward_half(l, 1, r, mb);
  // The output layer's weight gradient (side stream) before any grads-ready hook or the embedding backward,
  // which adds to the same tensor when tied.
  MT_PROF("tp.wgrad_join", join_wgrad());
}

void CudaGPT::mlp_backward_half(int64_t l, int64_t half, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t rows = mb.B / 2 * mb.S, r0 = half * rows, h = D.h, F = W_.F, F1 = W_.F1;
  if (l + 1 < L_) wait_reduced(half);  // the layer above's input-gradient norm of these rows (under SP, and gather)
  // This rank's piece of the half (the output gradient's rows the row-parallel bias gradient takes under SP),
  // and the half's output gradient (gathered under SP).
  const int64_t pr = piece(rows), p0 = half * pr;
  const bf16* dy = sp_ ? s.dres16_full + r0 * h : s.dres16 + r0 * h;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  bf16* dfc1 = s.dfc1 + r0 * F1;
  if (D.swiglu) {
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, rows, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, s.dact + r0 * F, F, ab_, ab_, nullptr, stream_));
  } else {
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, rows, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, dfc1, F, ab_, ab_, nullptr, stream_,
                                             {cuda::GemmEpilogue::kDGelu, r.fc1 + r0 * F, F}));
  }
  wgrad_with_bias(stream_, "bwd.gemm.fc2_wgrad", h, rows, dy, r.act + r0 * F, F, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
  if (!fuse_row && lw.fc2_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc2_b), s.dres16 + p0 * h, pr, h, stream_, dt_));
  if (D.swiglu) MT_PROF("bwd.activation", cuda::swiglu_backward_bf16(dfc1, s.dact + r0 * F, r.fc1 + r0 * F1, rows, F, stream_, dt_));
  MT_PROF("bwd.gemm.fc1_dgrad", lt.gemm_ex(false, false, rows, h, F1, 1.0f, dfc1, F1, w(lw.fc1_w), h, 0.0f, s.dxn + r0 * h, h, ab_, ab_, nullptr, stream_));
  if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), dfc1, rows, F1, stream_, dt_));
  // The reduction and the norm start beside this half's fc1 weight gradient: the norm writes dres / dres16
  // (and under SP the gather dres16_full), which fc2's weight gradient (queued before) read, not what fc1's reads.
  void* x_mid = r.x_mid;
  reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add({.dres = s.dres + p0 * h, .dres16 = s.dres16 + p0 * h, .dw = g(lw.ln2_w), .db = g(lw.ln2_b),
                                                        .dy = sum, .x = res_at(x_mid, p0 * h), .mean = r.mean2 + p0, .rstd = r.rstd2 + p0,
                                                        .w = w(lw.ln2_w), .w_offset = norm_offset_, .rows = pr, .width = h, .rms = D.rms, .type = dt_, .res16 = res16_,
                                                        .dropout = drop(mb, attn_site(first_layer_ + l), row0(mb.B * mb.S) + p0), .partials = s.norm_part,
                                                        .parts = parts}, st));
    if (sp_) gather_half(half, rows, s.dres16, s.dres16_full, st);
  });
  wgrad_with_bias(stream_, "bwd.gemm.fc1_wgrad", F1, rows, dfc1, r.xn2 + r0 * h, h, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
}

void CudaGPT::attention_backward_half(int64_t l, int64_t half, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t Bh = mb.B / 2, rows = Bh * mb.S, r0 = half * rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq;
  wait_reduced(half);  // the MLP's input-gradient norm of these rows (under SP, and gather)
  const int64_t pr = piece(rows), p0 = half * pr;
  const bf16* dy = sp_ ? s.dres16_full + r0 * h : s.dres16 + r0 * h;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  MT_PROF("bwd.gemm.proj_dgrad", lt.gemm_ex(false, false, rows, Hd, h, 1.0f, dy, h, w(lw.proj_w), Hd, 0.0f, s.d_o + r0 * Hd, Hd, ab_, ab_, nullptr, stream_));
  wgrad_with_bias(stream_, "bwd.gemm.proj_wgrad", h, rows, dy, r.o + r0 * Hd, Hd, lw.proj_w, fuse_row ? lw.proj_b : -1);
  if (!fuse_row && lw.proj_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.proj_b), s.dres16 + p0 * h, pr, h, stream_, dt_));
  const cuda::SdpaShape sh{Bh, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
  MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward(sh, r.q + r0 * Hd, r.k + r0 * KVd, r.v + r0 * KVd, r.o + r0 * Hd, s.d_o + r0 * Hd,
                                                                r.stats + half * Bh * D.nh_local * mb.S, s.dq + r0 * Hd, s.dk + r0 * KVd,
                                                                s.dv + r0 * KVd, stream_));
  MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward({.dqkv = s.qkv + r0 * Wq, .dq = s.dq + r0 * Hd, .dk = s.dk + r0 * KVd,
                                                               .dv = s.dv + r0 * KVd, .positions = layer_positions(mb) + r0,
                                                               .table = D.rope ? rope_table_ : nullptr, .rows = rows, .heads = D.nh_local,
                                                               .groups = D.ng_local, .head_dim = D.d, .rot_dim = D.rot_dim, .type = dt_, .interleaved = D.rotary_interleaved}, stream_));
  MT_PROF("bwd.gemm.qkv_dgrad", lt.gemm_ex(false, false, rows, h, Wq, 1.0f, s.qkv + r0 * Wq, Wq, w(lw.qkv_w), h, 0.0f, s.dxn + r0 * h, h, ab_, ab_, nullptr,
                                           stream_));
  if (!bgrad_epilogue_ && lw.qkv_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), s.qkv + r0 * Wq, rows, Wq, stream_, dt_));
  // As in the MLP: the reduction and the norm beside this half's QKV weight gradient (which reads s.qkv and
  // xn1; the projection's, which read dres16 or under SP dres16_full, is queued before).
  // Under SP the gather feeds the layer below (the embedding's backward takes the fp32 gradient instead),
  // and after the second half the layer's replicated gradients (norms, row-parallel biases) are summed over
  // TP on the TP stream, behind the norms that finish them.
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add({.dres = s.dres + p0 * h, .dres16 = s.dres16 + p0 * h, .dw = g(lw.ln1_w), .db = g(lw.ln1_b),
                                                        .dy = sum, .x = res_at(x_in, p0 * h), .mean = r.mean1 + p0, .rstd = r.rstd1 + p0,
                                                        .w = w(lw.ln1_w), .w_offset = norm_offset_, .rows = pr, .width = h, .rms = D.rms, .type = dt_, .res16 = res16_,
                                                        .dropout = first_layer_ + l > 0 ? drop(mb, mlp_site(first_layer_ + l - 1), row0(mb.B * mb.S) + p0) : nullptr,
                                                        .partials = s.norm_part, .parts = parts}, st));
    if (sp_ && l > 0) gather_half(half, rows, s.dres16, s.dres16_full, st);
  });
  // After the half's event, so that the layer below's first half does not wait for it (wait_tp_stream does).
  if (half == 1) sum_replicated_grads(layer_replicated_[static_cast<size_t>(l)], tp_stream_);
  wgrad_with_bias(stream_, "bwd.gemm.qkv_wgrad", Wq, rows, s.qkv + r0 * Wq, r.xn1 + r0 * h, h, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
}

}  // namespace mt
