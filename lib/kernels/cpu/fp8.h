// fp8.h: the two FP8 formats of Hopper's tensor cores (OCP FP8: E4M3 with no infinities and E5M2, IEEE-like)
// and Transformer Engine's per-tensor scaling, on the CPU: the emulation the CUDA engine's FP8 casts are
// checked against bit for bit. A value is scaled (x * scale in fp32), rounded to the nearest FP8 value (ties to
// even) and saturated to the largest finite one (CUDA's __NV_SATFINITE); NaN stays NaN.
#pragma once

#include <cstdint>

namespace mt::cpu {

enum class Fp8Format { kE4M3, kE5M2 };

// The largest finite value: 448 (E4M3), 57344 (E5M2).
float fp8_max(Fp8Format format);
// The FP8 byte nearest to x (saturating), and the value of a byte.
uint8_t fp8_encode(float x, Fp8Format format);
float fp8_decode(uint8_t bits, Fp8Format format);
// x rounded to the format (fp8_decode(fp8_encode(x))), without the byte.
float fp8_round(float x, Fp8Format format);

// Current (tensorwise) scaling, Transformer Engine's compute_scale_from_amax without epsilon or powers of 2:
// max / amax, 1 where amax is 0 or not finite, the largest float where the quotient overflows.
float fp8_scale_from_amax(float amax, Fp8Format format);
// The largest |x| over n values; NaN values are skipped (as the CUDA kernel's fmaxf and Transformer Engine's amax).
float abs_max(const float* x, int64_t n);
// q[i] = fp8_round(x[i] * scale): the FP8 values (unscaled; the tensor is q / scale).
void fp8_quantize(float* q, const float* x, int64_t n, float scale, Fp8Format format);

// Blockwise scaling (Transformer Engine's Float8BlockScaling, Megatron's --fp8-recipe blockwise): one scale per block,
// from the block's amax as fp8_scale_from_amax, rounded down to a power of 2 (TE's default power_2_scale: the float's
// mantissa bits cleared), so that dividing by it is exact.
float fp8_block_scale(float amax, Fp8Format format);
// out = fp8_round(x * s) / s per block of block_rows x block_cols (the edges' blocks cut short) of x [rows, cols]: the
// values the FP8 bytes and their block scales stand for.
void fp8_quantize_blocks(float* out, const float* x, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols, Fp8Format format);

}  // namespace mt::cpu
