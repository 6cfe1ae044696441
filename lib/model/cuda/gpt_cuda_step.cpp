// gpt_cuda_step.cpp: a microbatch through the CUDA model: the embedding, every layer (plain or split), the
// final norm, the output layer and the fused loss, then the backward in reverse with the grads-ready hook
// after each layer. One set of buffers serves every microbatch: a forward's backward follows it.
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

// The residual stream's first rows: the vocabulary-parallel lookup summed over TP (scattered over the
// tokens under SP), positions added by one rank.
void CudaGPT::embed(const DeviceMicrobatch& mb, int64_t T) {
  const ModelDims& D = D_;
  void* x0 = records_[0]->x_in;
  const bf16* wpe = wpe_ >= 0 && tp_rank_ == 0 ? w(wpe_) : nullptr;
  // The sum is taken in fp32 (in s_->emb unless the stream is fp32 and whole), then rounded once into a
  // 16-bit stream; without positions or dropout, a 16-bit stream is summed in 16 bits (exact, see below).
  float* out = sp_ || res16_ ? s_->emb : static_cast<float*>(x0);
  MT_PROF("fwd.embedding", cuda::embedding_forward_bf16(out, mb.tokens, mb.positions, w(wte_), wpe, T, D.h, v0_, D.V_local, stream_, dt_));
  int64_t n = T * D.h;
  if (tp_ && sp_) {
    n = T / tp_size_ * D.h;
    float* mine = res16_ ? out + tp_rank_ * n : static_cast<float*>(x0);  // in place: this rank's block of `out`
    MT_PROF("tp.reduce_scatter", tp_->reduce_scatter_on(out, mine, n, WireType::kF32, stream_));
    out = mine;
  } else if (tp_) {
    // Each token's row comes from the one rank that holds it and the others add exact zeros: without learned
    // positions or dropout to add before rounding, the sum is exact in 16 bits, on half the bytes.
    if (res16_ && wpe_ < 0 && !drop(mb, kEmbedSite, row0(T))) {
      MT_PROF("fwd.embedding", cuda::cast_to_bf16(static_cast<bf16*>(x0), out, n, stream_, dt_));
      MT_PROF("tp.all_reduce", tp_->all_reduce_on(x0, n, wire_, ReduceOp::kSum, stream_));
      return;
    }
    MT_PROF("tp.all_reduce", tp_->all_reduce_on(out, n, WireType::kF32, ReduceOp::kSum, stream_));
  }
  if (const cuda::RowDropout* d = drop(mb, kEmbedSite, row0(T))) MT_PROF("fwd.dropout", cuda::dropout_rows_f32(out, n / D.h, D.h, *d, stream_));
  if (res16_) MT_PROF("fwd.embedding", cuda::cast_to_bf16(static_cast<bf16*>(x0), out, n, stream_, dt_));
}

// Cross-entropy over this rank's vocabulary columns (the whole vocabulary at TP 1) of rows [r0, r0 + n), whose
// logits are in s.logits; the gradient replaces the logits when training.
void CudaGPT::loss(const DeviceMicrobatch& mb, float grad_scale, int64_t r0, int64_t n) {
  Scratch& s = *s_;
  const bool train = grad_scale > 0.0f;
  float* losses = s.losses + r0;
  const int32_t* labels = mb.labels + r0;
  const float* mask = mb.loss_mask ? mb.loss_mask + r0 : nullptr;
  if (!tp_) {
    MT_PROF("loss.cross_entropy", cuda::cross_entropy_fused_bf16(losses, s.logits, labels, mask, grad_scale, n, D_.V, train, stream_, dt_, loss_scale_));
    return;
  }
  MT_PROF("loss.cross_entropy", cuda::ce_shard_stats(s.ce_stats, s.logits, labels, n, D_.V_local, v0_, stream_, dt_));
  MT_PROF("tp.loss_max", tp_->all_reduce_on(s.ce_stats, n, WireType::kF32, ReduceOp::kMax, stream_));
  MT_PROF("loss.cross_entropy", cuda::ce_shard_rescale(s.ce_stats, n, stream_));
  MT_PROF("tp.loss_sum", tp_->all_reduce_on(s.ce_stats + 2 * n, 2 * n, WireType::kF32, ReduceOp::kSum, stream_));
  MT_PROF("loss.cross_entropy", cuda::ce_shard_finish({.losses = losses, .logits = s.logits, .stats = s.ce_stats, .targets = labels,
                                                       .loss_mask = mask, .grad_scale = grad_scale, .rows = n, .vocab_local = D_.V_local,
                                                       .vocab_start = v0_, .write_grad = train, .type = dt_, .loss_scale = loss_scale_}, stream_));
}

// The output layer and the loss, loss_chunk_rows_ rows at a time, so that a microbatch's whole logits never exist
// (one chunk's [rows, V_local] buffer serves them all). When training, each chunk's loss gradient goes back
// through the output layer at once: the weight gradient accumulates, and the final norm's output gradient
// replaces that norm's output rows in s.xnf (read by the weight gradient just before, on the same stream); the
// backward starts from it.
void CudaGPT::output_layer(const DeviceMicrobatch& mb, float grad_scale, int64_t T) {
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t h = D_.h, V = D_.V_local;
  const bool train = grad_scale > 0.0f;
  for (int64_t r0 = 0; r0 < T; r0 += loss_chunk_rows_) {
    const int64_t n = std::min(loss_chunk_rows_, T - r0);
    bf16* x = s.xnf + r0 * h;
    MT_PROF("fwd.gemm.logits", lt.gemm_ex(false, true, n, V, h, 1.0f, x, h, w(out_w_), h, 0.0f, s.logits, V, ab_, ab_, nullptr, stream_));
    loss(mb, grad_scale, r0, n);
    if (!train) continue;
    const float beta = wgrad_beta(out_w_);  // (0: the iteration's first chunk of rows, where the gradient is overwritten)
    MT_PROF("bwd.gemm.logits_wgrad", lt.gemm_ex(true, false, V, h, n, 1.0f, s.logits, V, x, h, beta, g(out_w_), h, ab_, CUDA_R_32F, nullptr, stream_));
    MT_PROF("bwd.gemm.logits_dgrad", lt.gemm_ex(false, false, n, h, V, 1.0f, s.logits, V, w(out_w_), h, 0.0f, x, h, ab_, ab_, nullptr, stream_));
  }
}

void CudaGPT::step(const DeviceMicrobatch& mb, float grad_scale, float loss_weight, float* loss_acc) {
  forward(mb, grad_scale, loss_weight, loss_acc);
  if (grad_scale > 0.0f) backward(mb);
}

CudaGPT::Record& CudaGPT::act(int64_t l) { return recomputed(l) ? *recompute_record_ : *records_[static_cast<size_t>(l)]; }

// The split layers under SP take their [T, .] rows in half-major order (see piece()): the first layer's input
// norm and the last layer's output gradient are gathered half by half, and the positions permuted the same way.
bf16* CudaGPT::gather_layer_rows(bf16* local, bf16* full, int64_t T) {
  if (!(split_forward_ && sp_)) return gather_rows(local, full, T);
  for (int64_t half = 0; half < 2; ++half) gather_half(half, T / 2, local, full, stream_);
  return full;
}

// The active slot's activations go back to it; slot k's take their place.
void CudaGPT::park(Slot& into) {
  into.records = std::move(records_);
  into.x_final = s_->x_final;
  into.xnf = s_->xnf;
  into.meanf = s_->meanf;
  into.rstdf = s_->rstdf;
}

void CudaGPT::activate(int64_t k) {
  if (k < 0 || k >= max_in_flight()) throw std::logic_error("CUDA model: slot " + std::to_string(k) + " of " + std::to_string(max_in_flight()));
  if (k == active_) return;
  park(slots_[static_cast<size_t>(active_)]);
  Slot& next = slots_[static_cast<size_t>(k)];
  records_ = std::move(next.records);
  s_->x_final = next.x_final;
  s_->xnf = next.xnf;
  s_->meanf = next.meanf;
  s_->rstdf = next.rstdf;
  active_ = k;
}

void CudaGPT::forward(const DeviceMicrobatch& mb, float grad_scale, float loss_weight, float* loss_acc, int64_t slot, const void* input, void* output) {
  activate(slot);
  const ModelDims& D = D_;
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  if (T > T_max_ || mb.S != S_local_) throw std::logic_error("CUDA model: microbatch larger than the buffers");
  if (split_forward_ && sp_ && T != T_max_) throw std::logic_error("CUDA model: the split layers under SP need micro batches of the configured size");
  if (slots_[static_cast<size_t>(slot)].forwarded || slots_[static_cast<size_t>(slot)].weights_due) {
    throw std::logic_error("CUDA model: a forward into slot " + std::to_string(slot) + " before the backward of the microbatch in it");
  }
  if ((!pre_ && !input) || (!post_ && !output)) throw std::logic_error("CUDA model: a pipeline stage's forward needs its input and output buffers");
  if (split_forward_ && sp_) {  // half k's rows: piece k of each rank's Tl, rank after rank
    const auto pr = static_cast<size_t>(Tl / 2);
    for (int64_t half = 0; half < 2; ++half) {
      MT_CUDA_CHECK(cudaMemcpy2DAsync(s.half_pos + half * (T / 2), pr * 4, mb.positions + half * Tl / 2, static_cast<size_t>(Tl) * 4, pr * 4,
                                      static_cast<size_t>(tp_size_), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  moe_record_stats_ = grad_scale > 0.0f;  // the MoE statistics of training forwards (not evaluation, not a recompute)
  moe_training_ = grad_scale > 0.0f;
  f8_keep_xt_ = grad_scale > 0.0f;
  f8_forward_casts_weights_ = f8_weights_due_ || grad_scale <= 0.0f;  // (evaluation: the weights as they are now)
  if (f8_scale_) {  // FP8 delayed scaling: this microbatch's input scales, and at the iteration's first the weights' cast scales
    const bool training = grad_scale > 0.0f;
    f8_record_ = f8_training_ = training;
    f8_cast_weights_ = training && f8_weights_due_;
    const size_t bytes = static_cast<size_t>(f8_slots_) * 4;
    MT_CUDA_CHECK(cudaMemcpyAsync(slots_[static_cast<size_t>(slot)].f8_x_scale, f8_scale_ + kFp8Input * f8_slots_, bytes, cudaMemcpyDeviceToDevice, stream_));
    if (f8_cast_weights_) MT_CUDA_CHECK(cudaMemcpyAsync(f8_wcast_, f8_scale_ + kFp8Weight * f8_slots_, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  // Forward
  need_params(embed_end_);
  if (pre_) {
    embed(mb, T);
  } else {  // the previous stage's residual-stream rows
    MT_PROF("pp.input", MT_CUDA_CHECK(cudaMemcpyAsync(records_[0]->x_in, input, boundary_activation_bytes(T), cudaMemcpyDeviceToDevice, stream_)));
  }
  need_params(layer_end_[0]);
  const LayerW& l0 = layers_[0];
  MT_PROF("fwd.add_norm", cuda::add_norm_forward({.sum_out = nullptr, .y = norm_out(act(0).xn1), .mean = act(0).mean1, .rstd = act(0).rstd1,
                                                  .x = records_[0]->x_in, .delta = nullptr, .w = w(l0.ln1_w), .b = w(l0.ln1_b), .w_offset = norm_offset_, .rows = Tl,
                                                  .width = h, .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = res16_}, stream_));
  gather_layer_rows(s.xn_l, act(0).xn1, T);
  if (split_forward_) {
    split_layers_forward(mb);
    need_params(numel_);
    MT_PROF("fwd.add_norm", cuda::add_norm_forward({.sum_out = s.x_final, .y = norm_out(s.xnf), .mean = s.meanf, .rstd = s.rstdf,
                                                    .x = act(L_ - 1).x_mid, .delta = sp_ ? s.delta_l : s.delta, .w = w(lnf_w_), .b = w(lnf_b_),
                                                    .w_offset = norm_offset_, .rows = Tl, .width = h, .eps = D.eps, .rms = D.rms, .type = dt_, .res16 = res16_,
                                                    .dropout = drop(mb, mlp_site(first_layer_ + L_ - 1), row0(T))}, stream_));
    gather_rows(s.xn_l, s.xnf, T);
  }
  for (int64_t l = 0; !split_forward_ && l < L_; ++l) {
    Record& r = act(l);
    const bf16* mlp = layer_forward(l, r, mb);
    if (l + 1 < L_) {
      need_params(layer_end_[static_cast<size_t>(l + 1)]);
      input_norm_forward(l + 1, mb, 0, Tl, mlp, {}, stream_);
      gather_rows(s.xn_l, act(l + 1).xn1, T);
    } else if (post_) {
      need_params(numel_);
      MT_PROF("fwd.add_norm", cuda::add_norm_forward({.sum_out = s.x_final, .y = norm_out(s.xnf), .mean = s.meanf, .rstd = s.rstdf, .x = r.x_mid,
                                                      .delta = mlp, .w = w(lnf_w_), .b = w(lnf_b_), .w_offset = norm_offset_, .rows = Tl, .width = h, .eps = D.eps,
                                                      .rms = D.rms, .type = dt_, .res16 = res16_, .dropout = drop(mb, mlp_site(first_layer_ + L_ - 1), row0(T))}, stream_));
      gather_rows(s.xn_l, s.xnf, T);
    } else {
      // The stage's output: the residual stream after the last layer (the sum the next stage's first norm
      // takes); the kernel's norm of it, with unit weights, goes unused to scratch that no slot swaps.
      MT_PROF("fwd.add", cuda::add_norm_forward({.sum_out = output, .y = s.dxn, .mean = nullptr, .rstd = s.losses, .x = r.x_mid,
                                                 .delta = mlp, .w = unit_w_, .b = nullptr, .rows = Tl, .width = h, .eps = D.eps, .rms = D.rms,
                                                 .type = dt_, .res16 = res16_, .dropout = drop(mb, mlp_site(first_layer_ + L_ - 1), row0(T))}, stream_));
    }
  }
  if (post_) {
    output_layer(mb, grad_scale, T);
    MT_PROF("loss.sum", cuda::masked_loss_sum(loss_acc, s.losses, mb.loss_mask, T, loss_weight, stream_));
  }
  slots_[static_cast<size_t>(slot)].forwarded = grad_scale > 0.0f;
  moe_record_stats_ = false;
  if (grad_scale > 0.0f) f8_weights_due_ = false;  // (FP8: the later microbatches read this iteration's cast weights)
  if (f8_scale_ && grad_scale > 0.0f) fp8_update(kFp8Input, kFp8Weight);  // the forward scales (TE: at the fp8_autocast's exit)
  f8_record_ = f8_cast_weights_ = false;
}

// Selective recompute (--recompute-modules mlp / moe): layer l's MLP block again from its saved norm output (r.xn2, every
// row of the microbatch), into the buffers every such layer shares. A backward records no MoE statistics
// (moe_record_stats_ is off after the forward) and routes as the training forward did (moe_training_); the dense MLP
// leaves out fc2's GEMM, whose output its backward does not read. (FP8 is refused with it: its casts would record again.)
void CudaGPT::recompute_mlp(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  if (moe_record_stats_) throw std::logic_error("CUDA model: an MLP recompute while the MoE statistics are recorded");
  mlp_forward_unit(l, r, mb, whole_span(mb), false);  // (the MoE block always writes its experts' outputs: its backward reads them)
}

void CudaGPT::backward(const DeviceMicrobatch& mb, int64_t slot, const float* output_grad, float* input_grad, bool defer_weights) {
  activate(slot);
  if (!slots_[static_cast<size_t>(slot)].forwarded) throw std::logic_error("CUDA model: a backward without its forward (slot " + std::to_string(slot) + ")");
  slots_[static_cast<size_t>(slot)].forwarded = false;
  if (defer_weights && !can_defer_weights()) {
    throw std::logic_error("CUDA model: the weight gradients run apart only without full recompute, the split TP layers and MoE layers");
  }
  // A deferring backward saves the layers' output gradients into the slot and leaves the hooks to W.
  defer_into_ = defer_weights ? &slots_[static_cast<size_t>(slot)] : nullptr;
  slots_[static_cast<size_t>(slot)].weights_due = defer_weights;
  const std::function<void(int64_t)> hook = defer_weights ? std::function<void(int64_t)>() : grads_ready_;
  f8_keep_xt_ = true;  // (a recomputed layer's cast writes its x^T again)
  moe_training_ = true;  // (a recomputed MoE layer chooses as its training forward did)
  f8_forward_casts_weights_ = false;  // (and reads the iteration's cast weights)
  if (f8_scale_) {  // FP8 delayed scaling: this backward's output-gradient scales; recomputed layers record nothing
    MT_CUDA_CHECK(cudaMemcpyAsync(slots_[static_cast<size_t>(slot)].f8_dy_scale, f8_scale_ + kFp8GradOutput * f8_slots_,
                                  static_cast<size_t>(f8_slots_) * 4, cudaMemcpyDeviceToDevice, stream_));
    f8_record_ = f8_cast_weights_ = false;
    f8_training_ = true;
  }
  const ModelDims& D = D_;
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  const bool split_sp = split_forward_ && sp_;
  if ((!post_ && !output_grad) || (!pre_ && !input_grad)) throw std::logic_error("CUDA model: a pipeline stage's backward needs its gradient buffers");
  if (post_) {
    // Backward: the final norm, from its output gradient (the training forward's output layer left it in s.xnf)
    const bf16* dfinal = combine_rows(s.xnf, s.dxn_l, T);
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.dres, 0, static_cast<size_t>(Tl * h) * 4, stream_)));
    MT_PROF("bwd.norm", cuda::norm_backward_add({.dres = s.dres, .dres16 = s.dres16, .dw = g(lnf_w_), .db = g(lnf_b_), .dy = dfinal, .x = s.x_final,
                                                 .mean = s.meanf, .rstd = s.rstdf, .w = w(lnf_w_), .w_offset = norm_offset_, .rows = Tl, .width = h, .rms = D.rms, .type = dt_,
                                                 .res16 = res16_, .dropout = drop(mb, mlp_site(first_layer_ + L_ - 1), row0(T))}, stream_));
    sum_replicated_grads(final_replicated_, stream_);
  } else {
    // The next stage's input gradient is this stage's output gradient (the residual stream's, fp32); the last
    // layer's MLP branch takes it through that branch's dropout mask, in 16 bits (what the final norm's
    // backward hands the layer on the last stage).
    MT_PROF("pp.output_grad", MT_CUDA_CHECK(cudaMemcpyAsync(s.dres, output_grad, boundary_gradient_bytes(T), cudaMemcpyDeviceToDevice, stream_)));
    const float* branch = s.dres;
    if (const cuda::RowDropout* d = drop(mb, mlp_site(first_layer_ + L_ - 1), row0(T))) {
      MT_CUDA_CHECK(cudaMemcpyAsync(s.emb, s.dres, boundary_gradient_bytes(T), cudaMemcpyDeviceToDevice, stream_));
      MT_PROF("bwd.dropout", cuda::dropout_rows_f32(s.emb, Tl, h, *d, stream_));
      branch = s.emb;
    }
    MT_PROF("bwd.cast", cuda::cast_to_bf16(s.dres16, branch, Tl * h, stream_, dt_));
  }
  for (int64_t l = L_ - 1; l >= 0; --l) {
    Record& r = act(l);
    // The split backward's norms of the layer above may still read the shared recompute record on tp_stream_.
    if (split_forward_ && recomputed(l) && l + 1 < L_) {
      wait_reduced(0);
      wait_reduced(1);
    }
    if (recomputed(l)) {
      const LayerW& lw = layers_[static_cast<size_t>(l)];
      MT_PROF("recompute.norm", cuda::add_norm_forward({.sum_out = nullptr, .y = norm_out(r.xn1), .mean = r.mean1, .rstd = r.rstd1,
                                                        .x = records_[static_cast<size_t>(l)]->x_in, .delta = nullptr, .w = w(lw.ln1_w),
                                                        .b = w(lw.ln1_b), .w_offset = norm_offset_, .rows = Tl, .width = h, .eps = D.eps, .rms = D.rms, .type = dt_,
                                                        .res16 = res16_}, stream_));
      gather_rows(s.xn_l, r.xn1, T);
      layer_forward(l, r, mb);
    }
    if (mlp_recomputed(l)) recompute_mlp(l, r, mb);
    if (split_forward_) {
      if (split_sp && l + 1 == L_) gather_layer_rows(s.dres16, s.dres16_full, T);  // the final norm's input gradient
      split_layer_backward(l, r, mb);
    } else {
      layer_backward(l, r, mb);
    }
    if (final_backward_ && hook) {
      // The layer's norm gradients come from tp_stream_; the hook's collectives follow the compute stream.
      // (A wait even when the hook launches nothing: TP x DP without SP loses some overlap here.)
      if (split_forward_) wait_tp_stream();
      hook(layer_start_[static_cast<size_t>(l)]);
    }
  }
  // The input gradient's last rows, before the embedding reads them, and the replicated gradients' sums
  // (the optimizer follows the compute stream).
  if (split_forward_) wait_tp_stream();
  defer_into_ = nullptr;
  if (f8_scale_) fp8_update(kFp8GradOutput, kFp8GradOutput);  // the output-gradient scales (TE: at the end of the microbatch's backward)
  if (final_backward_) f8_weights_due_ = true;  // (FP8: the next iteration casts the weights anew)
  if (!pre_) {  // the previous stage's output gradient
    MT_PROF("pp.input_grad", MT_CUDA_CHECK(cudaMemcpyAsync(input_grad, s.dres, boundary_gradient_bytes(T), cudaMemcpyDeviceToDevice, stream_)));
    // This stage's parameters start at its first layer (another chunk of the rank may still be computing
    // those below: interleaving, one buffer).
    if (final_backward_ && hook) hook(layer_start_[0]);
    return;
  }
  // The embedding gradient from every token (gathered under SP): each rank's vocabulary rows, and the
  // positions' on every rank alike.
  float* demb = s.dres;
  if (const cuda::RowDropout* d = drop(mb, kEmbedSite, row0(T))) MT_PROF("bwd.dropout", cuda::dropout_rows_f32(s.dres, Tl, h, *d, stream_));
  if (sp_) {
    MT_PROF("tp.all_gather", tp_->all_gather_on(s.dres, s.emb, Tl * h, WireType::kF32, stream_));
    demb = s.emb;
  }
  MT_PROF("bwd.embedding", cuda::embedding_backward(g(wte_), demb, mb.tok_ids, mb.tok_offsets, mb.tok_positions, mb.n_tok_ids, h, stream_));
  if (wpe_ >= 0) MT_PROF("bwd.embedding", cuda::embedding_backward(g(wpe_), demb, mb.pos_ids, mb.pos_offsets, mb.pos_positions, mb.n_pos_ids, h, stream_));
  if (final_backward_ && hook) hook(0);
}

}  // namespace mt
