// gpt_cuda_context.cpp: context parallelism on the CUDA engine, --cp-comm-type p2p (ring attention, as Megatron's
// Transformer Engine path computes it). Each rank holds chunks r and 2 CP - 1 - r of every sequence (model/
// context_parallel.h); its queries meet every rank's keys and values in CP steps, the block of step i being rank
// r - i's, which the ring brings from the previous rank while step i - 1's block is computed. The blocks merge by
// their log-sum-exp (kernels/cuda/context_attention.h). The backward walks the ring again: each K/V block travels
// with the fp32 gradients of its keys and values, every rank adding its queries' share, and one last hop takes them
// home. --cp-comm-type a2a (Ulysses): all-to-alls between the sequence and the heads around one whole-sequence
// attention. The CPU engine's model/cpu/context_attention.cpp is the oracle.
#include "model/cuda/gpt_cuda_state.h"

#include <stdexcept>

#include "kernels/cuda/context_a2a.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

cuda::RingShape CudaGPT::ring_shape(const DeviceMicrobatch& mb) const {
  if (doc_mask_ && mb.row_start == nullptr) throw std::logic_error("CudaGPT: --reset-attention-mask without the microbatch's document starts");
  return cuda::RingShape{mb.B, mb.S / 2, D_.nh_local, D_.ng_local, D_.d, D_.softmax_scale, dt_, doc_mask_};
}

// --reset-attention-mask: block (rank, source)'s document bias in s_->ring_bias, else null.
const bf16* CudaGPT::ring_bias(const cuda::RingShape& shape, const DeviceMicrobatch& mb, int64_t rank, int64_t source) {
  if (!shape.documents) return nullptr;
  MT_PROF("attention.document_bias", cuda::ring_document_bias(s_->ring_bias, mb.row_start, shape, D_.cp, rank, source, stream_));
  return s_->ring_bias;
}

void CudaGPT::ring_pass(const void* send_k, const void* send_v, void* recv_k, void* recv_v, int64_t n, WireType type) {
  if (!cp_) throw std::logic_error("CudaGPT: context parallelism without its group (set_context_parallel)");
  const int size = cp_->group_size(), rank = cp_->group_rank();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  MT_CUDA_CHECK(cudaEventRecord(cp_ready_ev_, stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(cp_stream_, cp_ready_ev_, 0));
  // (the sends and the receives each in the same order on every rank: keys, then values)
  MT_PROF_ON(cp_stream_, "cp.ring",
             cp_->send_recv_on({{true, const_cast<void*>(send_k), n, next},
                                {true, const_cast<void*>(send_v), n, next},
                                {false, recv_k, n, prev},
                                {false, recv_v, n, prev}},
                               type, cp_stream_));
  MT_CUDA_CHECK(cudaEventRecord(cp_done_ev_, cp_stream_));
}

void CudaGPT::ring_wait() { MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, cp_done_ev_, 0)); }

void CudaGPT::ring_attention_forward(Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  const int64_t cp = D_.cp, rank = cp_ ? cp_->group_rank() : 0, T = mb.B * mb.S, kv = T * W_.KVd;
  const cuda::RingShape shape = ring_shape(mb);
  const cuda::RingScratch scratch{s.ring_out, s.ring_lse, nullptr, nullptr, nullptr};
  const bf16 *k = r.k, *v = r.v;
  for (int64_t i = 0; i < cp; ++i) {
    const int64_t source = (rank - i + cp) % cp;
    bf16* next = s.ring_kv[i % 2];
    // The next block comes while this one is computed (its buffer's last reader, step i - 1, queued before).
    if (i + 1 < cp) ring_pass(k, v, next, next + kv, kv, wire_);
    const bf16* bias = ring_bias(shape, mb, rank, source);
    MT_PROF("fwd.attention",
            cuda::ring_block_forward(shape, cuda::ring_block(rank, source), r.q, k, v, scratch, s.ring_acc, r.stats, i == 0, stream_, bias));
    if (i + 1 < cp) {
      ring_wait();
      k = next;
      v = next + kv;
    }
  }
  MT_PROF("fwd.attention", cuda::ring_output(shape, s.ring_acc, r.o, stream_));
}

void CudaGPT::ring_attention_backward(Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  const int64_t cp = D_.cp, rank = cp_ ? cp_->group_rank() : 0, T = mb.B * mb.S, kv = T * W_.KVd;
  const cuda::RingShape shape = ring_shape(mb);
  const cuda::RingScratch scratch{nullptr, nullptr, s.ring_dq16, s.ring_dk16, s.ring_dv16};
  MT_PROF("bwd.attention", {
    MT_CUDA_CHECK(cudaMemsetAsync(s.ring_dq, 0, static_cast<size_t>(T * W_.Hd) * 4, stream_));
    MT_CUDA_CHECK(cudaMemsetAsync(s.ring_dkv[0], 0, static_cast<size_t>(2 * kv) * 4, stream_));
  });
  const bf16 *k = r.k, *v = r.v;
  float* dkv = s.ring_dkv[0];
  for (int64_t i = 0; i < cp; ++i) {
    const int64_t source = (rank - i + cp) % cp;
    bf16* next = s.ring_kv[i % 2];
    if (i + 1 < cp) ring_pass(k, v, next, next + kv, kv, wire_);  // the next block, beside this one's backward
    const bf16* bias = ring_bias(shape, mb, rank, source);
    MT_PROF("bwd.attention", cuda::ring_block_backward(shape, cuda::ring_block(rank, source), r.q, k, v, r.o, s.d_o, r.stats, scratch, s.ring_dq, dkv,
                                                       dkv + kv, stream_, bias));
    // This block's key and value gradients, with this rank's share added, go on to the next rank (after the last
    // step, to the block's own rank); the previous rank's come in for the next block.
    float* incoming = s.ring_dkv[(i + 1) % 2];
    ring_pass(dkv, dkv + kv, incoming, incoming + kv, kv, WireType::kF32);
    ring_wait();
    dkv = incoming;
    if (i + 1 < cp) {
      k = next;
      v = next + kv;
    }
  }
  MT_PROF("bwd.attention", {
    cuda::ring_to_16(s.ring_dq, s.dq, T * W_.Hd, dt_, stream_);
    cuda::ring_to_16(dkv, s.dk, kv, dt_, stream_);
    cuda::ring_to_16(dkv + kv, s.dv, kv, dt_, stream_);
  });
}

cuda::SdpaShape CudaGPT::a2a_shape(const DeviceMicrobatch& mb) const {
  const int64_t cp = D_.cp;
  return cuda::SdpaShape{mb.B, mb.S * cp, D_.nh_local / cp, D_.ng_local / cp, D_.d, D_.softmax_scale, dt_, doc_mask_};
}

void CudaGPT::a2a_to_sequence(bf16* sequence, const bf16* local, int64_t heads, const DeviceMicrobatch& mb) {
  if (!cp_) throw std::logic_error("CudaGPT: context parallelism without its group (set_context_parallel)");
  Scratch& s = *s_;
  const cuda::A2aShape shape{mb.B, mb.S / 2, D_.cp, heads, D_.d};
  cuda::a2a_pack_heads(s.a2a_send, local, shape, false, stream_);
  MT_PROF("cp.all_to_all", cp_->all_to_all_on(s.a2a_send, s.a2a_recv, mb.B * mb.S * heads / D_.cp * D_.d, wire_, stream_));
  cuda::a2a_sequence_order(sequence, s.a2a_recv, shape, false, stream_);
}

void CudaGPT::a2a_to_local(bf16* local, const bf16* sequence, int64_t heads, const DeviceMicrobatch& mb) {
  if (!cp_) throw std::logic_error("CudaGPT: context parallelism without its group (set_context_parallel)");
  Scratch& s = *s_;
  const cuda::A2aShape shape{mb.B, mb.S / 2, D_.cp, heads, D_.d};
  cuda::a2a_sequence_order(s.a2a_send, sequence, shape, true, stream_);
  MT_PROF("cp.all_to_all", cp_->all_to_all_on(s.a2a_send, s.a2a_recv, mb.B * mb.S * heads / D_.cp * D_.d, wire_, stream_));
  cuda::a2a_pack_heads(local, s.a2a_recv, shape, true, stream_);
}

void CudaGPT::a2a_attention_forward(Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  a2a_to_sequence(s.a2a_q, r.q, D_.nh_local, mb);
  a2a_to_sequence(s.a2a_k, r.k, D_.ng_local, mb);
  a2a_to_sequence(s.a2a_v, r.v, D_.ng_local, mb);
  const bf16* doc_bias = document_bias(mb);  // (--reset-attention-mask: the whole sequences' documents)
  MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(a2a_shape(mb), s.a2a_q, s.a2a_k, s.a2a_v, s.a2a_o, r.stats, stream_, doc_bias));
  a2a_to_local(r.o, s.a2a_o, D_.nh_local, mb);
}

void CudaGPT::a2a_attention_backward(Record& r, const DeviceMicrobatch& mb) {
  Scratch& s = *s_;
  a2a_to_sequence(s.a2a_q, r.q, D_.nh_local, mb);
  a2a_to_sequence(s.a2a_k, r.k, D_.ng_local, mb);
  a2a_to_sequence(s.a2a_v, r.v, D_.ng_local, mb);
  a2a_to_sequence(s.a2a_o, r.o, D_.nh_local, mb);
  a2a_to_sequence(s.a2a_do, s.d_o, D_.nh_local, mb);
  const bf16* doc_bias = document_bias(mb);
  MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward(a2a_shape(mb), s.a2a_q, s.a2a_k, s.a2a_v, s.a2a_o, s.a2a_do, r.stats, s.a2a_dq,
                                                                s.a2a_dk, s.a2a_dv, stream_, doc_bias));
  a2a_to_local(s.dq, s.a2a_dq, D_.nh_local, mb);
  a2a_to_local(s.dk, s.a2a_dk, D_.ng_local, mb);
  a2a_to_local(s.dv, s.a2a_dv, D_.ng_local, mb);
}

}  // namespace mt
