// gpt_cuda_split.cpp: under tensor parallelism, the schedule of every layer's units (gpt_cuda_units.cpp) forward and
// backward as two halves of the microbatch interleaved block by block, each half's row-parallel reductions (and the norms
// after them, under SP with the gathers) on the TP stream beside the other half's compute.
#include "model/cuda/gpt_cuda_state.h"

#include <cstdint>

#include "tensor/cuda/cuda_check.h"
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

// Every reduction goes through tp_stream_ in the order issued here, which is the same on every TP rank;
// collectives on the compute stream before (the embedding's) and after (the loss's) are ordered against
// them by the events. Per layer: each half's attention block, its projection's reduction and the MLP's input norm
// left running on the TP stream; then each half's MLP block (after its norm), its reduction and the next layer's input
// norm (under SP on this rank's piece of the half, then gathered).
void CudaGPT::split_layers_forward(const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  const int64_t rows = mb.B / 2 * mb.S;
  for (int64_t l = 0; l < L_; ++l) {
    Record& r = act(l);
    for (int64_t half = 0; half < 2; ++half) {
      const RowSpan sp = half_span(mb, half);
      if (l > 0) wait_reduced(half);  // the previous layer's MLP output reduced and this layer's input norm taken
      attention_forward_unit(l, r, mb, sp);
      reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
        mlp_norm_forward(l, r, mb, sp.piece_first, sp.piece_rows, sum, parts, st);
        if (sp_) gather_half(half, rows, s.xn_l, r.xn2, st);
      });
    }
    // The MLP halves' reductions are followed by the next layer's input norm on the TP stream, which reads
    // that layer's weights: the compute stream waits for them first (the TP stream follows it).
    if (l + 1 < L_) need_params(layer_end_[static_cast<size_t>(l + 1)]);
    for (int64_t half = 0; half < 2; ++half) {
      const RowSpan sp = half_span(mb, half);
      wait_reduced(half);  // the attention output reduced and the MLP's input norm taken
      mlp_forward_unit(l, r, mb, sp);
      if (l + 1 == L_) {  // the final norm runs after both halves, on the compute stream
        reduce_half(half, rows, s.delta, s.delta_l, nullptr);
        continue;
      }
      reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
        input_norm_forward(l + 1, mb, sp.piece_first, sp.piece_rows, sum, parts, st);
        if (sp_) gather_half(half, rows, s.xn_l, act(l + 1).xn1, st);
      });
    }
  }
  wait_reduced(0);
  wait_reduced(1);
}

// The split TP backward (with the split forward): each layer's MLP and attention blocks as two halves of
// the micro batch's sequences; a half's input-gradient reduction and the norm backward that consumes it run
// on tp_stream_ while the compute stream runs the other half's GEMMs and attention. The weight gradients
// accumulate half by half, on the compute stream after the half's reduction is queued. s_->dres / dres16 as in
// layer_backward; the half's output gradient is gathered under SP (dres16_full).
void CudaGPT::split_layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  const int64_t rows = mb.B / 2 * mb.S, h = D_.h;
  for (int64_t half = 0; half < 2; ++half) {
    const RowSpan sp = half_span(mb, half);
    if (l + 1 < L_) wait_reduced(half);  // the layer above's input-gradient norm of these rows (under SP, and gather)
    mlp_backward_unit(l, r, mb, sp, (sp_ ? s.dres16_full : s.dres16) + sp.first * h);
    // The reduction and the norm start beside this half's fc1 weight gradient: the norm writes dres / dres16
    // (and under SP the gather dres16_full), which fc2's weight gradient (queued before) read, not what fc1's reads.
    reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
      mlp_norm_backward(l, r, mb, sp.piece_first, sp.piece_rows, sum, parts, st);
      if (sp_) gather_half(half, rows, s.dres16, s.dres16_full, st);
    });
    mlp_fc1_wgrad(l, r, sp, stream_);
  }
  for (int64_t half = 0; half < 2; ++half) {
    const RowSpan sp = half_span(mb, half);
    wait_reduced(half);  // the MLP's input-gradient norm of these rows (under SP, and gather)
    const bf16* dy = (sp_ ? s.dres16_full : s.dres16) + sp.first * h;
    attention_backward_unit(l, r, mb, sp, dy, true);
    // As in the MLP: the reduction and the norm beside this half's QKV weight gradient (which reads s.qkv and
    // xn1; the projection's, which read dres16 or under SP dres16_full, is queued before).
    // Under SP the gather feeds the layer below (the embedding's backward takes the fp32 gradient instead),
    // and after the second half the layer's replicated gradients (norms, row-parallel biases) are summed over
    // TP on the TP stream, behind the norms that finish them.
    reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
      input_norm_backward(l, r, mb, sp.piece_first, sp.piece_rows, sum, parts, st);
      if (sp_ && l > 0) gather_half(half, rows, s.dres16, s.dres16_full, st);
    });
    // After the half's event, so that the layer below's first half does not wait for it (wait_tp_stream does).
    if (half == 1) sum_replicated_grads(layer_replicated_[static_cast<size_t>(l)], tp_stream_);
    attention_wgrads(l, r, sp, dy, false, stream_);
  }
  // The output layer's weight gradient (side stream) before any grads-ready hook or the embedding backward,
  // which adds to the same tensor when tied.
  MT_PROF("tp.wgrad_join", join_wgrad());
}

}  // namespace mt
