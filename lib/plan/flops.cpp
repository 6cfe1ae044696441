// flops.cpp: FLOPs = T*[6h*e*F*L + 6L*(h*(n*d + 2*g*d) + n*d*h) + 6h*V] + T*s*6*n*d*L (Megatron; its MLA form with
// --multi-latent-attention; with --mtp-num-layers N, L + N layers, 6N(3h + 2h^2) and (1 + N) 6hV).
#include "plan/flops.h"

#include <algorithm>

#include "config/moe_pattern.h"
#include "config/resolve.h"

namespace mt {

double flops_for_tokens(const Config& c, double T) {
  const double h = static_cast<double>(c.model.hidden_size.value_or(0));
  const double n = static_cast<double>(c.model.num_attention_heads.value_or(1));
  const double d = static_cast<double>(c.model.kv_channels.value_or(static_cast<int64_t>(h / n)));
  const double g = static_cast<double>(effective_query_groups(c));
  const double e = gated_mlp(c.model) ? 3.0 : 2.0;
  const int64_t L = c.model.num_layers.value_or(0);
  const double s = static_cast<double>(c.data.seq_length.value_or(0));
  const double V = static_cast<double>(c.derived.padded_vocab_size);
  const double F = static_cast<double>(c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(h), c.model.swiglu)));
  const double Fmoe = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F)));
  const double topk = static_cast<double>(c.moe.moe_router_topk);
  const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0));
  double mlp = 0;
  const std::vector<bool> pattern = moe_layer_pattern(c);
  for (int64_t l = 0; l < L; ++l) {
    const bool moe = pattern[static_cast<size_t>(l)];
    mlp += moe ? Fmoe * topk + shared : F;
  }
  // Multi-token prediction (Megatron's count): each module's layer of the last layer's kind, its norms and projection
  // 6 (3h + 2h^2), and its logits.
  const double mtp = static_cast<double>(c.model.mtp_num_layers.value_or(0));
  if (L > 0) mlp += mtp * (pattern.back() ? Fmoe * topk + shared : F);
  const double Ld = static_cast<double>(L) + mtp;
  const double mtp_proj = 6.0 * mtp * (3.0 * h + 2.0 * h * h);
  if (c.model.multi_latent_attention) {
    // Megatron's MLA terms: the query projection(s) (a latent of rank Rq with its norm's +1), the keys' and values'
    // latent of rank Rkv (its up projection to dn + dv per head, +1 the norm), the shared RoPE key (h x dr), the output
    // projection (n dv x h); the core attention over query / key heads of dn + dr and values of dv.
    const ModelConfig& m = c.model;
    const double dn = static_cast<double>(m.qk_head_dim), dr = static_cast<double>(m.qk_pos_emb_head_dim), dv = static_cast<double>(m.v_head_dim);
    const double Rkv = static_cast<double>(m.kv_lora_rank);
    const double q_term = m.q_lora_rank ? static_cast<double>(*m.q_lora_rank) * (h + n * (dn + dr) + 1.0) : h * n * (dn + dr);
    const double attention = 6.0 * (q_term + Rkv * (h + n * (dn + dv) + 1.0) + h * dr + n * dv * h);
    const double per_token = 6.0 * h * e * mlp + Ld * attention + mtp_proj + 6.0 * h * V * (1.0 + mtp);
    return T * per_token + T * s * 3.0 * n * (dn + dr + dv) * Ld;
  }
  const double per_token = 6.0 * h * e * mlp + 6.0 * Ld * (h * (n * d + 2.0 * g * d) + n * d * h) + mtp_proj + 6.0 * h * V * (1.0 + mtp);
  return T * per_token + T * s * 6.0 * n * d * Ld;
}

double flops_per_iteration(const Config& c) {
  const double T = static_cast<double>(c.derived.global_batch_size) * static_cast<double>(c.data.seq_length.value_or(0));
  return flops_for_tokens(c, T);
}

double peak_tflops_for_gpu(const std::string& name, bool fp8) {
  auto has = [&](const char* k) { return name.find(k) != std::string::npos; };
  double bf16 = 0;
  if (has("H100") || has("H200") || has("H800") || has("GH200")) bf16 = 989.4;
  else if (has("B200") || has("GB200")) bf16 = 2250;
  else if (has("A100") || has("A800")) bf16 = 312;
  return fp8 ? 2 * bf16 : bf16;
}

}  // namespace mt
