// norm_bf16.h (CUDA): the residual add fused with LayerNorm / RMSNorm for the mixed-precision model: the
// residual stream is the run's 16-bit type (res16, Megatron's default) or fp32 (--fp32-residual-connection),
// the normalised output 16-bit (the next GEMM's input). The backward adds the
// norm's input gradient into the fp32 residual gradient, writes its bf16 copy (the next GEMM's input)
// and accumulates the weight (and bias) gradients deterministically (per-block partials, then a fixed-order
// column sum: no atomics).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"
#include "kernels/cuda/dropout.h"

namespace mt::cuda {

// A tensor-parallel sum left as its ranks' partial results side by side (an all-to-all's output): `count`
// blocks of the rows, `stride` elements apart. The norms sum them in fp32 and round the sum once to the
// 16-bit type before using it, as the reduce-scatter they replace does (bit for bit at two ranks; NCCL's
// ring rounds after each addition beyond).
struct Partials {
  int count = 1;
  int64_t stride = 0;
};

// s = x + dropout(delta) (delta may be null; dropout: hidden dropout, may be null); y = norm(s) * (w + w_offset) (+ b), over
// `rows` rows of `width`. parts: delta is the sum of that many partial blocks (see Partials). sum_out (may be
// null) receives s; mean is unused (may be null) for RMSNorm. x and sum_out are float*, or with res16 of type
// `type` (s rounded to it before the statistics are taken).
struct AddNorm {
  void* sum_out = nullptr;
  bf16* y = nullptr;
  float *mean = nullptr, *rstd = nullptr;
  const void* x = nullptr;
  const bf16 *delta = nullptr, *w = nullptr, *b = nullptr;
  float w_offset = 0.0f;  // the norm scales by w + w_offset (--apply-layernorm-1p: 1), added in fp32
  int64_t rows = 0, width = 0;
  float eps = 1e-5f;
  bool rms = false;
  F16 type = F16::kBF16;
  bool res16 = false;
  const RowDropout* dropout = nullptr;
  Partials parts = {};
};
void add_norm_forward(const AddNorm& a, cudaStream_t stream);

// dres += d(norm input); dres16 = bf16(dres); dw (+ db unless null) += weight gradients (fp32).
// x: the forward's norm input (float*, or of type `type` with res16). dropout (may be null): dres16 is the
// gradient of the dropped-out branch that produced the residual's last addition, dres * mask.
// partials: scratch for the weight gradients' per-block sums, norm_backward_partials(width) floats, for a call
// on a stream other than the compute stream; null: taken from the caching allocator (compute stream only).
// parts: dy is the sum of that many partial blocks (see Partials).
struct NormBackward {
  float* dres = nullptr;
  bf16* dres16 = nullptr;
  float *dw = nullptr, *db = nullptr;
  const bf16* dy = nullptr;
  const void* x = nullptr;
  const float *mean = nullptr, *rstd = nullptr;
  const bf16* w = nullptr;
  float w_offset = 0.0f;  // as AddNorm's (the weight gradient is the scale's either way)
  int64_t rows = 0, width = 0;
  bool rms = false;
  F16 type = F16::kBF16;
  bool res16 = false;
  const RowDropout* dropout = nullptr;
  float* partials = nullptr;
  Partials parts = {};
};
void norm_backward_add(const NormBackward& a, cudaStream_t stream);
int64_t norm_backward_partials(int64_t h);

}  // namespace mt::cuda
