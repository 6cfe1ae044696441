// sdpa_cudnn.h (CUDA): causal scaled-dot-product attention forward and backward through cuDNN's fused
// flash-attention engines, reached with the backend (graph) API: the operation graph is spelled out op by
// op (matmul, scale, causal mask, softmax with statistics, matmul) and cuDNN's runtime fusion turns it into
// one flash kernel. Plans are built once per shape and cached. bf16 (or fp16: SdpaShape::type) in and out,
// fp32 statistics.
//
// Layout (BSHD, as the model keeps it): Q, dQ [B, S, Hq, D]; K, dK [B, S, Hk, D]; V, dV [B, S, Hk, Dv]; O, dO
// [B, S, Hq, Dv] (Dv = D unless SdpaShape::Dv says otherwise: multi-latent attention's values), Hq a multiple of Hk
// (grouped-query attention). Stats: [B, Hq, S] fp32 (log-sum-exp per row).
// With SdpaShape::bias, an additive bias [B, 1, S, Sk] of the same 16-bit type goes onto the scaled scores before the
// causal mask (cuDNN's bias input, shared by the heads): the document masks of --reset-attention-mask (kernels/cuda/
// document_bias.h), 0 where a query may see a key and a large negative value where it may not.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

struct SdpaShape {
  int64_t B, S, Hq, Hk, D;
  float scale;
  F16 type = F16::kBF16;  // of Q, K, V, O and their gradients
  bool bias = false;       // an additive bias [B, 1, S, Sk] (forward's and backward's `bias` argument)
  // Blocks of a longer sequence (context parallelism's ring attention, kernels/cuda/context_attention.h): Sk keys and
  // values (0: S), no causal mask unless `causal`, and the rows one sample takes in the buffers the pointers index
  // (0: S for Q, O, dO, dQ and the statistics; Sk for K, V, dK and dV), so that a block is a run of each sample's rows.
  int64_t Sk = 0;
  bool causal = true;
  int64_t q_rows = 0, kv_rows = 0;
  // Attention dropout (--attention-dropout; 0: none): each probability is kept with probability 1 - dropout by cuDNN's
  // Philox generator and scaled by 1 / (1 - dropout). The mask is a function of the call's seed (forward's and
  // backward's `dropout_seed`) and of the element's place in [B, Hq, S, Sk], so the backward, given the forward's
  // seed, regenerates the forward's mask. It is not the CPU engine's mask (kernels/cpu/attention.h).
  float dropout = 0;
  // Sliding-window attention (--window-size; needs `causal`): query i attends to keys i - window .. i; -1: no window.
  int64_t window = -1;
  // Attention sinks (--softmax-type): a logit per query head (forward's `sink`, fp32 [Hq]) in every row's softmax
  // denominator, a key with no value: the statistics include it, so the backward graph is unchanged; its gradient
  // (backward's `sink_grad`) comes from the statistics and the backward's row sums of dO * O.
  bool sink = false;
  // The values' (and so the output's) head dimension where it is not D (multi-latent attention); 0: D.
  int64_t Dv = 0;
  int64_t keys() const { return Sk > 0 ? Sk : S; }
  int64_t value_dim() const { return Dv > 0 ? Dv : D; }
  int64_t q_stride() const { return q_rows > 0 ? q_rows : S; }
  int64_t kv_stride() const { return kv_rows > 0 ? kv_rows : keys(); }
};

class CudnnSdpa {
 public:
  static CudnnSdpa& instance();
  // O, stats from Q, K, V (bf16 device pointers).
  void forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* stats, cudaStream_t stream,
               const void* bias = nullptr, uint64_t dropout_seed = 0, const float* sink = nullptr);
  // dQ, dK, dV (bf16, overwritten) from the forward's inputs, O, dO and stats (and the forward's dropout seed). With sinks
  // the sink logits' gradient is added into sink_grad (fp32 [Hq]; null: not wanted).
  void backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* o, const void* d_o, const float* stats,
                void* dq, void* dk, void* dv, cudaStream_t stream, const void* bias = nullptr, uint64_t dropout_seed = 0, const float* sink = nullptr,
                float* sink_grad = nullptr);
  // Whether cuDNN could build both graphs for this shape (tests; the model refuses otherwise).
  std::string check(const SdpaShape& s);
  // --deterministic-mode: the backward without the fp32 dQ accumulator that cuDNN's flash engines add into with atomics
  // (their order varies from run to run); dQ = dS K is written whole from a dP workspace of B x Hq x S x Sk 16-bit values
  // (the frontend's deterministic algorithm on Hopper), bitwise repeatable at some cost in time and memory. Process-wide
  // (the model sets it from its configuration); the graphs of both kinds stay cached.
  void set_deterministic(bool on);
  bool deterministic() const;
  ~CudnnSdpa();

 private:
  CudnnSdpa();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mt::cuda
