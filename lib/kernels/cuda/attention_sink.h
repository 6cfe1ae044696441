// attention_sink.h (CUDA): the pieces of attention sinks (--softmax-type) around cuDNN's attention graphs
// (kernels/cuda/sdpa_cudnn.h): the sink logits in fp32 for the forward graph, and their gradient, which the graphs do
// not produce. Row (b, h, i)'s softmax has the sink as a key with no value, p_sink = exp(sink[h] - stats) with the
// forward's log-sum-exp statistics, and d sink[h] = -sum over (b, i) of p_sink rowsum(dO * O) (the CPU engine's
// kernels/cpu/attention.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

// out[i] = logits[i] as fp32 (16-bit parameters of type t).
void sink_logits_to_float(float* out, const bf16* logits, int64_t n, cudaStream_t stream, F16 t = F16::kBF16);

// sink_grad[h] -= sum over b < B, i < S of exp(sink[h] - stats[(b H + h) stats_rows + i]) row_sums[(b H + h) S + i] sum_scale:
// one block per head, a fixed order (deterministic). row_sums: the backward's rowsum(dO * O) times 1 / sum_scale.
void attention_sink_grad(float* sink_grad, const float* sink, const float* stats, const float* row_sums, float sum_scale, int64_t B, int64_t H,
                         int64_t S, int64_t stats_rows, cudaStream_t stream);

}  // namespace mt::cuda
