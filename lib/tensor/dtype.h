// dtype.h: element types and the float <-> bf16 / fp16 conversions (round to nearest even) the CPU
// reference and the checkpoint code share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace mt {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kF8E4M3, kF8E5M2 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_fp16(float f);
float fp16_to_float(uint16_t h);

inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }
inline float round_fp16(float f) { return fp16_to_float(float_to_fp16(f)); }

}  // namespace mt
