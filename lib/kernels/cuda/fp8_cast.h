// fp8_cast.h (CUDA): Transformer Engine's tensorwise (current) FP8 scaling on the device: the amax of a 16-bit
// tensor, then its cast to E4M3 / E5M2 with scale = max / amax computed from that amax in the kernel (as
// kernels/cpu/fp8's fp8_scale_from_amax: 1 for a zero or non-finite amax), x * scale rounded to nearest even and
// saturated (__NV_SATFINITE), with the transposed copy Hopper's FP8 GEMMs need for the gradients (they take
// both operands K-contiguous only). Nothing waits for the host: amax, scale and inverse scale stay on the device.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

enum class Fp8Type : uint8_t { kE4M3, kE5M2 };

// *amax = max |x| over n bf16 values (the previous value is overwritten).
void fp8_amax(const bf16* x, int64_t n, float* amax, cudaStream_t stream);
// out [rows, cols] and/or out_t [cols, rows] (either may be null) = fp8(x * scale) of x [rows, cols] (leading
// dimension cols), scale from *amax; *scale_inv = 1 / scale when scale_inv is not null.
void fp8_cast(const bf16* x, int64_t rows, int64_t cols, const float* amax, Fp8Type type, uint8_t* out, uint8_t* out_t, float* scale_inv,
              cudaStream_t stream);

// Delayed scaling (model/fp8_scaling.h): the same cast with the scale given (*scale, not from an amax), and, when
// amax_accumulator is not null, max |x| added to it (an atomic max) in the same pass: one read of x.
void fp8_cast_scaled(const bf16* x, int64_t rows, int64_t cols, const float* scale, float* amax_accumulator, Fp8Type type, uint8_t* out,
                     uint8_t* out_t, float* scale_inv, cudaStream_t stream);
// The delayed-scaling update of n tensors after their accumulators' reduction: history [len][stride] (entry e of
// tensor i at history[e * stride + i]) and scale [n], as fp8_delayed_update (model/fp8_scaling.h) computes it.
void fp8_delayed_update(float* scale, float* history, int64_t n, int64_t stride, int64_t len, bool max_algo, float scaled_max,
                        cudaStream_t stream);

}  // namespace mt::cuda
