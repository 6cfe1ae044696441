// dtype.cpp: IEEE half conversions with round to nearest even, subnormals and overflow to inf.
#include "tensor/dtype.h"

#include <cmath>

namespace mt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kF8E4M3: return "fp8_e4m3";
    case DType::kF8E5M2: return "fp8_e5m2";
  }
  return "?";
}

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {
    // Subnormal half (or zero): value = m * 2^-24 with m rounded to nearest even.
    const float a = std::fabs(f) * 16777216.0f;  // exact scaling by 2^24
    const float r = std::nearbyint(a);            // default rounding mode: nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  const uint32_t exp = ((absx >> 23) - 127 + 15) << 10;
  const uint32_t mant = absx & 0x7fffffu;
  uint32_t h = exp | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | h);
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    uint32_t u;
    std::memcpy(&u, &out, 4);
    u |= sign;
    std::memcpy(&out, &u, 4);
    return out;
  }
  uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
  else u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&out, &u, 4);
  return out;
}

}  // namespace mt
