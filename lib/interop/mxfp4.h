// mxfp4.h: the OCP Microscaling format MXFP4, as HuggingFace stores GPT-OSS's experts (transformers'
// quantization_config {"quant_method": "mxfp4"}): each row of a weight is cut into groups of 32 values along its
// input dimension; a group is 16 bytes of FP4 E2M1 codes (two a byte, the low nibble first) and one E8M0 scale
// byte (the power of two 2^(byte - 127)). Code c is the E2M1 value: sign bit 8, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

inline constexpr int64_t kMxfp4GroupSize = 32;

// The values of `rows` rows of `groups` groups each: blocks [rows, groups, 16] bytes, scales [rows, groups]
// bytes, out [rows, groups * 32] floats (exact: every value is a small multiple of a power of two). A scale of
// 255 (E8M0's NaN) is a DataError naming `what`.
std::vector<float> mxfp4_dequantize(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales, int64_t rows, int64_t groups,
                                    const std::string& what);

}  // namespace mt
