// gpu_check.h: what the GPU test programs share: a PASS / FAIL line per check with the failures counted (main
// returns nonzero when any failed), bf16-exact random values, and the 16-bit conversions of whole vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/rng.h"

namespace mt::test {

// The GPU tests' multi-latent attention models (DeepSeek's), beside their base flags: LLaMA-style with the query latent,
// the latents' norms and YaRN with mscale (heads 32 + 16 wide, values 24); GPT-style with one query projection, no latent
// norms, plain RoPE, values wider than the heads (56).
inline constexpr const char* kDeepseekFlags =
    "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --untie-embeddings-and-output-weights "
    "--disable-bias-linear --multi-latent-attention --q-lora-rank 48 --kv-lora-rank 32 --qk-head-dim 32 --qk-pos-emb-head-dim 16 "
    "--v-head-dim 24 --qk-layernorm --rotary-scaling-factor 4 --mscale 1 --mscale-all-dim 1 --yarn-original-max-position-embeddings 16 ";
inline constexpr const char* kDeepseekGptFlags =
    "--position-embedding-type rope --multi-latent-attention --kv-lora-rank 40 --qk-head-dim 32 --qk-pos-emb-head-dim 16 --v-head-dim 56 "
    "--rope-type rope ";
// GPT-style with learned positions (Megatron's default position embedding) beside MLA's own RoPE.
inline constexpr const char* kDeepseekLearnedFlags =
    "--position-embedding-type learned_absolute --multi-latent-attention --kv-lora-rank 40 --qk-head-dim 32 --qk-pos-emb-head-dim 16 "
    "--v-head-dim 24 --rope-type rope ";

inline int failures = 0;
inline void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}

// n normal values times scale, rounded to bf16 (exact in bf16, and for normal magnitudes in fp16 too).
inline std::vector<float> random_bf16_values(size_t n, uint64_t key, float scale = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(float_to_bf16(scale * philox_normal(key, i)));
  return v;
}

// max |a - b| / max |b| over the vectors; infinite where a holds a value that is not finite.
template <typename A, typename B>
double rel_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(static_cast<double>(a[i]))) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

// max |a - b| over the vectors; infinite where a holds a value that is not finite.
template <typename A, typename B>
double max_abs_err(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(static_cast<double>(a[i]))) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return num;
}

// To and from the 16-bit bits of bf16, or of fp16.
inline std::vector<uint16_t> to_16(const std::vector<float>& x, bool fp16 = false) {
  std::vector<uint16_t> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = fp16 ? float_to_fp16(x[i]) : float_to_bf16(x[i]);
  return o;
}
inline std::vector<float> from_16(const std::vector<uint16_t>& x, bool fp16 = false) {
  std::vector<float> o(x.size());
  for (size_t i = 0; i < x.size(); ++i) o[i] = fp16 ? fp16_to_float(x[i]) : bf16_to_float(x[i]);
  return o;
}

}  // namespace mt::test
