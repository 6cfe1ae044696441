// fp8_swiglu.h (CUDA): SwiGLU fused with delayed scaling's FP8 cast of its output, as Transformer Engine fuses the
// cast into the kernel that produces a GEMM operand: the forward writes the FP8 input of fc2 (and its transpose),
// the backward the FP8 output gradient of fc1 (and its transpose), without the 16-bit tensor in between. Each
// value is the 16-bit value swiglu_forward_bf16 / swiglu_backward_bf16 would write, then cast as fp8_cast_scaled
// casts it (the same bytes, the same amax), so the fused and the separate paths agree bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp8_cast.h"

namespace mt::cuda {

// Where a delayed-scaling cast writes: scale given, the amax added to amax_accumulator (may be null), the FP8
// row-major out and transposed out_t (either may be null), 1 / scale into scale_inv (may be null).
struct Fp8CastTarget {
  const float* scale = nullptr;
  float* amax_accumulator = nullptr;
  Fp8Type type = Fp8Type::kE4M3;
  uint8_t* out = nullptr;
  uint8_t* out_t = nullptr;
  float* scale_inv = nullptr;
};

// y = silu(gate) * up of x [rows, 2F] (the gate in the first F columns), cast into t ([rows, F] and [F, rows]);
// y16 (may be null) gets the 16-bit values too. bf16 only. False (nothing launched) where the fused kernel does not
// apply: rows and F multiples of 8, x and y16 16-byte aligned, t's outputs 8-byte aligned.
bool fp8_swiglu_forward_cast(const bf16* x, int64_t rows, int64_t F, const Fp8CastTarget& t, bf16* y16, cudaStream_t stream);
// dx = d(silu(gate) * up) [rows, 2F] from dy [rows, F] and x [rows, 2F], cast into t ([rows, 2F] and [2F, rows]).
// The same conditions (dy 16-byte aligned too).
bool fp8_swiglu_backward_cast(const bf16* dy, const bf16* x, int64_t rows, int64_t F, const Fp8CastTarget& t, cudaStream_t stream);

}  // namespace mt::cuda
