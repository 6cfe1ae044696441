// rope_frequencies.cpp: RoPE's inverse frequencies, and LLaMA 3.1's scaling of them.
#include "kernels/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mt {
namespace {

// The dimension (of rot_dim) whose frequency turns `rotations` times over the original context.
double yarn_correction_dim(double rotations, int64_t rot_dim, double base, double original_max) {
  return static_cast<double>(rot_dim) * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

// YaRN's blend: frequency i is inv / s where the ramp is 1 (beyond the range's high end: interpolated), inv where it is 0
// (below its low end: extrapolated), linear between.
void apply_yarn(std::vector<double>& inv, int64_t rot_dim, double base, const RopeScaling& y) {
  double low = yarn_correction_dim(y.yarn_beta_fast, rot_dim, base, y.yarn_original_max_positions);
  double high = yarn_correction_dim(y.yarn_beta_slow, rot_dim, base, y.yarn_original_max_positions);
  if (y.yarn_round_to_int) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(rot_dim - 1));
  if (low == high) high += 0.001;  // (as Megatron and HuggingFace: no division by zero)
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv[i] = inv[i] / y.yarn_factor * ramp + inv[i] * (1.0 - ramp);
  }
}

}  // namespace

double rope_attention_factor(const RopeScaling& scaling) {
  if (scaling.yarn_factor <= 0) return 1.0;
  return yarn_mscale(scaling.yarn_factor, scaling.yarn_mscale) / yarn_mscale(scaling.yarn_factor, scaling.yarn_mscale_all_dim);
}

std::vector<double> rope_inverse_frequencies(int64_t rot_dim, double base, const RopeScaling& scaling) {
  const int64_t half = rot_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  if (scaling.yarn_factor > 0) apply_yarn(inv, rot_dim, base, scaling);
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
