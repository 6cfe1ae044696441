// rope_frequencies.h: RoPE's inverse frequencies base^(-2i / rot_dim), i < rot_dim / 2, in double, and with
// --use-rope-scaling LLaMA 3.1's rescaling of them (Megatron's apply_rope_scaling, as HuggingFace's "llama3" rope type):
// wavelengths above original_max / low_freq_factor divided by the factor, below original_max / high_freq_factor kept,
// the band between blended linearly in original_max / wavelength. Megatron fixes low 1, high 4, original 8192. And
// --rotary-seq-len-interpolation-factor's linear position interpolation (Megatron's seq_len_interpolation_factor,
// HuggingFace's "linear" rope type): every position divided by the factor, that is every frequency. Both engines'
// RoPE take their angles from here.
#pragma once

#include <cstdint>
#include <vector>

namespace mt {

struct RopeScaling {
  double factor = 0;  // 0: none (--use-rope-scaling off); else --rope-scaling-factor
  double low_freq_factor = 1, high_freq_factor = 4, original_max_positions = 8192;
  double position_interpolation = 1;  // --rotary-seq-len-interpolation-factor (1: none)
};

std::vector<double> rope_inverse_frequencies(int64_t rot_dim, double base, const RopeScaling& scaling);

}  // namespace mt
