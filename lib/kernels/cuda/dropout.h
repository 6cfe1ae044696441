// dropout.h (CUDA): hidden dropout with the CPU engine's masks (kernels/cpu/dropout.h, model/model_dims.h's
// dropout_key): element i of sample b's [S, h] tokens at a site is kept when philox_uniform(key, i) >= p,
// kept values scaled by 1 / (1 - p). The mask is a pure function of the key and the element, so the
// backward (and a recompute) regenerates it instead of storing it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/rng.h"  // MT_HD

namespace mt::cuda {

struct RowDropout {
  float p = 0.0f;                  // 0: off
  const uint64_t* keys = nullptr;  // [B, stride]: each sample's keys, one per site
  int32_t stride = 0, site = 0;    // the row length of keys; this call's site (its column)
  int64_t t0 = 0;                  // the micro batch's token index of the call's row 0
  int64_t S = 1;                   // tokens per sample (this rank's, under context parallelism)
  // Context parallelism: the rank's two chunks of each sequence (model/context_parallel.h); the masks follow the
  // tokens' places in the whole sequence, as the CPU engine's.
  int64_t cp = 1, cp_rank = 0;
  MT_HD bool on() const { return p > 0.0f && keys != nullptr; }
};

// x[r, :] *= mask over rows [0, rows) of width h (fp32, in place).
void dropout_rows_f32(float* x, int64_t rows, int64_t h, const RowDropout& d, cudaStream_t stream);

// Attention dropout's generator state for cuDNN (kernels/cuda/sdpa_cudnn.h): dst[0] = seed, dst[2] = 0 (the offset; 16
// bytes apart, the alignment cuDNN's tensors declare), in stream order.
void write_philox_seed(int64_t* dst, uint64_t seed, cudaStream_t stream);

}  // namespace mt::cuda
