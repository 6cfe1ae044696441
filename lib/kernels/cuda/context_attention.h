// context_attention.h (CUDA): ring attention's blocks under Megatron's load-balanced causal split (context
// parallelism, --cp-comm-type p2p, as Transformer Engine computes it). With CP ranks a sequence is cut into 2 CP chunks
// of c tokens and rank r holds chunks r and 2 CP - 1 - r: 2c rows per sample, in that order. Its queries meet the
// keys and values of rank `source` (the ring brings each in turn) in one of three blocks:
//   source == rank: the diagonal, causal over the 2c x 2c rows (the local order is the sequence's order);
//   source <  rank: every query against the source's first chunk only (c keys, all earlier), no mask;
//   source >  rank: the second chunk's queries (c rows) against all 2c keys (all earlier), no mask.
// Each is one cuDNN flash attention (kernels/cuda/sdpa_cudnn.h) over runs of each sample's rows. A block's output
// merges into an fp32 accumulator by its log-sum-exp; the backward runs each block from the merged output and
// log-sum-exp (the softmax's statistics of the whole row), adding into fp32 gradients: the source's dK and dV travel
// back around the ring to it. Documents inside sequences are not handled here.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

enum class RingBlock { kDiagonal, kFirstKeys, kLastQueries };
RingBlock ring_block(int64_t rank, int64_t source);

// One rank's share: q, out, dout [B, 2c, Hq, D] (the run's 16-bit type); k, v [B, 2c, Hk, D] (the source's); the
// accumulators fp32 in the same layouts, the log-sum-exp [B, Hq, 2c] fp32.
struct RingShape {
  int64_t B = 0, c = 0, Hq = 0, Hk = 0, D = 0;  // c: the chunk length, a multiple of 4 (the statistics' alignment)
  float scale = 1;
  F16 type = F16::kBF16;
  bool documents = false;  // --reset-attention-mask: each block adds its document bias (ring_document_bias)
};

// Scratch of one block: its 16-bit output [B, 2c, Hq, D] and log-sum-exp [B, Hq, 2c], and in the backward its
// 16-bit gradients dq [B, 2c, Hq, D], dk and dv [B, 2c, Hk, D].
struct RingScratch {
  bf16* out = nullptr;
  float* lse = nullptr;
  bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

// Documents inside sequences: the bias [B, 1, queries, keys] of block (rank, source) (its query and key rows as the
// block kind takes them) from this rank's document starts row_start [B, 2c] (each token's document's first place in the
// sequence): 0 where the key's place in the sequence is in the query's document or after its start, a large finite
// negative before (kernels/cuda/document_bias.h's values); causality stays the block kind's. A query whose document
// starts after every key of a block gets no weight from it once the blocks merge. bias: B x 2c x 2c values at most.
void ring_document_bias(bf16* bias, const int32_t* row_start, const RingShape& s, int64_t cp, int64_t rank, int64_t source, cudaStream_t stream);
// The block of (q, the source's k and v), merged into acc [B, 2c, Hq, D] and acc_lse [B, Hq, 2c]; `first` (the
// diagonal, the ring's first step) overwrites them. bias: the block's document bias (s.documents), else null.
void ring_block_forward(const RingShape& s, RingBlock kind, const bf16* q, const bf16* k, const bf16* v, const RingScratch& scratch, float* acc,
                        float* acc_lse, bool first, cudaStream_t stream, const bf16* bias = nullptr);
// The merged output in the 16-bit type.
void ring_output(const RingShape& s, const float* acc, bf16* out, cudaStream_t stream);
// Why cuDNN cannot build one of the three blocks' graphs for this shape ("" when it can build them all).
std::string ring_check(const RingShape& s);
// n fp32 values (the accumulated gradients) in the 16-bit type.
void ring_to_16(const float* in, bf16* out, int64_t n, F16 type, cudaStream_t stream);
// The block's gradients from the merged output `out`, its log-sum-exp and dout: dq (fp32, this rank's) +=, dk and dv
// (fp32, the source's) +=.
void ring_block_backward(const RingShape& s, RingBlock kind, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout,
                         const float* lse, const RingScratch& scratch, float* dq, float* dk, float* dv, cudaStream_t stream, const bf16* bias = nullptr);

}  // namespace mt::cuda
