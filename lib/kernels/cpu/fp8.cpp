// fp8.cpp: FP8 rounding by arithmetic on the value (frexp / ldexp, exact in fp32), then the byte from the
// rounded value: the encoding and the rounding cannot disagree.
#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace mt::cpu {
namespace {

struct Format {
  int mantissa_bits, bias;
  float max;
};
Format format_of(Fp8Format f) { return f == Fp8Format::kE4M3 ? Format{3, 7, 448.0f} : Format{2, 15, 57344.0f}; }

}  // namespace

float fp8_max(Fp8Format format) { return format_of(format).max; }

float fp8_round(float x, Fp8Format format) {
  if (std::isnan(x)) return x;
  const Format f = format_of(format);
  const float a = std::fabs(x);
  if (a >= f.max) return std::copysign(f.max, x);
  if (a == 0.0f) return x;
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int min_normal_exp = 1 - f.bias;
  const int lead = std::max(e - 1, min_normal_exp);  // subnormals share the smallest normal's quantum
  const int quantum_exp = lead - f.mantissa_bits;
  const float steps = std::nearbyint(std::ldexp(a, -quantum_exp));  // ties to even (the default rounding mode)
  const float r = std::fmin(std::ldexp(steps, quantum_exp), f.max);
  return std::copysign(r, x);
}

uint8_t fp8_encode(float x, Fp8Format format) {
  const Format f = format_of(format);
  if (std::isnan(x)) return 0x7F;
  const float r = fp8_round(x, format);
  const uint8_t sign = std::signbit(r) ? 0x80 : 0x00;
  const float a = std::fabs(r);
  if (a == 0.0f) return sign;
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m 2^e
  const int exp_field = e - 1 + f.bias;
  if (exp_field <= 0) {  // subnormal: a = k 2^(1 - bias - mantissa_bits)
    const int k = static_cast<int>(std::ldexp(a, f.bias - 1 + f.mantissa_bits));
    return static_cast<uint8_t>(sign | k);
  }
  const int mant = static_cast<int>(std::ldexp(m, f.mantissa_bits + 1)) - (1 << f.mantissa_bits);
  return static_cast<uint8_t>(sign | (exp_field << f.mantissa_bits) | mant);
}

float fp8_decode(uint8_t bits, Fp8Format format) {
  const Format f = format_of(format);
  const int exp_bits = 7 - f.mantissa_bits;
  const int exp_field = (bits >> f.mantissa_bits) & ((1 << exp_bits) - 1);
  const int mant = bits & ((1 << f.mantissa_bits) - 1);
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (format == Fp8Format::kE4M3 && exp_field == 15 && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  if (format == Fp8Format::kE5M2 && exp_field == 31) {
    return mant == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  if (exp_field == 0) return sign * std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(static_cast<float>(mant + (1 << f.mantissa_bits)), exp_field - f.bias - f.mantissa_bits);
}

float fp8_scale_from_amax(float amax, Fp8Format format) {
  if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;
  const float scale = fp8_max(format) / amax;
  return std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
}

float abs_max(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));  // NaN skipped, as CUDA's fmaxf (and TE's amax)
  return m;
}

void fp8_quantize(float* q, const float* x, int64_t n, float scale, Fp8Format format) {
  for (int64_t i = 0; i < n; ++i) q[i] = fp8_round(x[i] * scale, format);
}

float fp8_block_scale(float amax, Fp8Format format) {
  const float scale = fp8_scale_from_amax(amax, format);
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, 4);
  bits &= 0xFF800000u;  // 2^floor(log2 scale)
  float pow2 = 0;
  std::memcpy(&pow2, &bits, 4);
  return pow2;
}

void fp8_quantize_blocks(float* out, const float* x, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols, Fp8Format format) {
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t r1 = std::min(rows, r0 + block_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const int64_t c1 = std::min(cols, c0 + block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      }
      const float scale = fp8_block_scale(amax, format);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) out[r * cols + c] = fp8_round(x[r * cols + c] * scale, format) / scale;
      }
    }
  }
}

}  // namespace mt::cpu
