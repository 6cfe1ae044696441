// gpt_cuda_layer.cpp: the plain schedule of one transformer layer over the microbatch's T rows (Tl in the residual
// stream): its units (gpt_cuda_units.cpp) forward (keeping what the backward reads, or nothing under recompute) and
// backward, the TP reductions on the compute stream and the column-parallel weight gradients on the side stream; and the
// weight gradients of a deferred backward (backward_weights).
#include "model/cuda/gpt_cuda_state.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bias_grad.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

// From r's xn1 (the normalised input, all T rows) to the MLP output of this rank's rows; r.x_mid and the
// rest saved in r.
const bf16* CudaGPT::layer_forward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S;
  const RowSpan all = whole_span(mb);
  attention_forward_unit(l, r, mb, all);
  mlp_norm_forward(l, r, mb, 0, local_rows(T), combine_rows(s.delta, s.delta_l, T), {}, stream_);
  gather_rows(s.xn_l, r.xn2, T);
  mlp_forward_unit(l, r, mb, all);
  return combine_rows(s.delta, s.delta_l, T);
}

// s_->dres holds d(layer output) on entry and d(layer input) on exit (s_->dres16 its bf16 copy), this
// rank's rows.
void CudaGPT::layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h, Wq = W_.Wq;
  const RowSpan all = whole_span(mb);
  const bool defer = defer_into_ != nullptr;  // B only: the weight gradients' inputs saved for backward_weights
  // MLP: fc1's weight gradient on the side stream, beside the input gradient's TP reduction.
  mlp_backward_unit(l, r, mb, all, gather_rows(s.dres16, s.dres16_full, T));
  // (An FP8 layer's weight gradients stay on the compute stream: they read the output gradient's FP8 transpose and
  // scale from the scratch that the next dgrad's cast writes.)
  const bool side = !fp8_layer(l);
  if (!lw.moe && !defer) mlp_fc1_wgrad(l, r, all, side ? fork_wgrad() : stream_);
  mlp_norm_backward(l, r, mb, 0, Tl, combine_rows(s.dxn, s.dxn_l, T), {}, stream_);
  // Attention. Under TP the projection's weight gradient waits for the side stream beside the QKV dgrad's
  // collective, which is longer than the QKV weight gradient alone: off the critical path (its dy is read before the
  // norm's backward below overwrites it).
  const bf16* dy = gather_rows(s.dres16, s.dres16_full, T);
  // (An FP8 layer's projection weight gradient runs right after its dgrad, which cast dy^T for it: later, after the QKV
  // dgrad's cast, it would cast dy again, and the QKV weight gradient after it its own output gradient again.)
  const bool defer_proj = wgrad_stream_ != nullptr && side;
  attention_backward_unit(l, r, mb, all, dy, !defer_proj);
  if (!defer) attention_wgrads(l, r, all, dy, defer_proj, side ? fork_wgrad() : stream_);
  const bf16* dattn = combine_rows(s.dxn, s.dxn_l, T);
  if (defer_proj && !sp_ && !defer) MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, proj_done_ev_, 0));  // under SP dy is dres16_full
  input_norm_backward(l, r, mb, 0, Tl, dattn, {}, stream_);
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
  const int64_t T = mb.B * mb.S, h = D_.h, Od = W_.Od, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  for (int64_t l = L_ - 1; l >= 0; --l) {
    const auto k = static_cast<size_t>(l);
    const LayerW& lw = layers_[k];
    Record& r = act(l);
    linear_wgrad(stream_, l, r, kLinearFc2, "bwd.gemm.fc2_wgrad", T, F, h, sl.dy_mlp[k], r.act, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
    if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), sl.dfc1[k], T, F1, stream_, dt_));
    linear_wgrad(stream_, l, r, kLinearFc1, "bwd.gemm.fc1_wgrad", T, h, F1, sl.dfc1[k], r.xn2, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
    linear_wgrad(stream_, l, r, kLinearProj, "bwd.gemm.proj_wgrad", T, Od, h, sl.dy_attn[k], r.o, lw.proj_w, fuse_row ? lw.proj_b : -1);
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
