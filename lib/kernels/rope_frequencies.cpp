// rope_frequencies.cpp: RoPE's inverse frequencies, and LLaMA 3.1's scaling of them.
#include "kernels/rope_frequencies.h"

#include <cmath>
#include <numbers>

namespace mt {

std::vector<double> rope_inverse_frequencies(int64_t rot_dim, double base, const RopeScaling& scaling) {
  const int64_t half = rot_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  if (scaling.factor > 0) {  // LLaMA 3.1's bands
    const double low_wavelength = scaling.original_max_positions / scaling.low_freq_factor;
    const double high_wavelength = scaling.original_max_positions / scaling.high_freq_factor;
    for (double& f : inv) {
      const double wavelength = 2.0 * std::numbers::pi / f;
      if (wavelength > low_wavelength) {
        f /= scaling.factor;  // long wavelengths: slowed by the factor
      } else if (wavelength >= high_wavelength) {  // the band between: blended
        const double smooth = (scaling.original_max_positions / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
  }
  // The position interpolation last: Megatron picks LLaMA 3.1's bands from the unscaled frequencies, then divides the
  // positions (position / factor x frequency: the frequency divided).
  if (scaling.position_interpolation != 1) {
    for (double& f : inv) f /= scaling.position_interpolation;
  }
  return inv;
}

}  // namespace mt
