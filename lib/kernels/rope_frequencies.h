// rope_frequencies.h: RoPE's inverse frequencies base^(-2i / rot_dim), i < rot_dim / 2, in double, and with
// --use-rope-scaling LLaMA 3.1's rescaling of them (Megatron's apply_rope_scaling, as HuggingFace's "llama3" rope type):
// wavelengths above original_max / low_freq_factor divided by the factor, below original_max / high_freq_factor kept,
// the band between blended linearly in original_max / wavelength. Megatron fixes low 1, high 4, original 8192. And
// --rotary-seq-len-interpolation-factor's linear position interpolation (Megatron's seq_len_interpolation_factor,
// HuggingFace's "linear" rope type): every position divided by the factor, that is every frequency. And YaRN
// (--position-embedding-type yarn: Megatron's YarnRotaryEmbedding, HuggingFace's "yarn" rope type): each frequency blended
// between itself and itself over the factor s by a linear ramp over the dimensions between the correction range's ends
// (where beta_fast and beta_slow rotations fit in the original context), and cos and sin multiplied by the attention
// factor (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1) (1 for s <= 1). Both engines' RoPE take their angles
// (and that factor) from here.
#pragma once

#include <cstdint>
#include <vector>

namespace mt {

struct RopeScaling {
  double factor = 0;  // 0: none (--use-rope-scaling off); else --rope-scaling-factor
  double low_freq_factor = 1, high_freq_factor = 4, original_max_positions = 8192;
  double position_interpolation = 1;  // --rotary-seq-len-interpolation-factor (1: none)
  // YaRN (yarn_factor 0: none; else --rotary-scaling-factor)
  double yarn_factor = 0, yarn_original_max_positions = 4096, yarn_beta_fast = 32, yarn_beta_slow = 1;
  double yarn_mscale = 1, yarn_mscale_all_dim = 0;
  bool yarn_round_to_int = true;  // the correction range's ends floored / ceiled to whole dimensions
};

std::vector<double> rope_inverse_frequencies(int64_t rot_dim, double base, const RopeScaling& scaling);
// What cos and sin are multiplied by: YaRN's attention factor, else 1.
double rope_attention_factor(const RopeScaling& scaling);

}  // namespace mt
