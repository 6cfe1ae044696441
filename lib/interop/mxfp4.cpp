// mxfp4.cpp: MXFP4 groups to floats (mxfp4.h).
#include "interop/mxfp4.h"

#include <cmath>
#include <stdexcept>

#include "config/errors.h"

namespace mt {

std::vector<float> mxfp4_dequantize(const std::vector<uint8_t>& blocks, const std::vector<uint8_t>& scales, int64_t rows, int64_t groups,
                                    const std::string& what) {
  // E2M1: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal (0 and 0.5).
  static constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  constexpr int64_t kBytes = kMxfp4GroupSize / 2;
  const int64_t n_groups = rows * groups;
  if (static_cast<int64_t>(scales.size()) != n_groups || static_cast<int64_t>(blocks.size()) != n_groups * kBytes) {
    throw std::logic_error("mxfp4_dequantize: " + what + ": the blocks' and scales' sizes do not match the shape");
  }
  std::vector<float> out(static_cast<size_t>(n_groups * kMxfp4GroupSize));
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t scale = scales[static_cast<size_t>(g)];
    if (scale == 0xFF) {
      throw DataError(what + " has a scale of 255 (MXFP4's NaN) in group " + std::to_string(g) + ": the checkpoint is damaged; download it again");
    }
    const int exponent = static_cast<int>(scale) - 127;
    const uint8_t* in = blocks.data() + g * kBytes;
    float* o = out.data() + g * kMxfp4GroupSize;
    for (int64_t b = 0; b < kBytes; ++b) {
      o[2 * b] = std::ldexp(kE2M1[in[b] & 0x0F], exponent);
      o[2 * b + 1] = std::ldexp(kE2M1[in[b] >> 4], exponent);
    }
  }
  return out;
}

}  // namespace mt
