// param_count.cpp: parameter arithmetic for dense and MoE GPT/LLaMA models.
#include "plan/param_count.h"

#include <algorithm>

#include "config/moe_pattern.h"
#include "config/resolve.h"

namespace mt {
namespace {

struct Shapes {
  int64_t h, n, d, g, F, Fmoe, E, topk, V, norm, bias, qkv_bias, mlp_mult, shared, sinks;
};

Shapes shapes_of(const Config& c) {
  Shapes s{};
  s.h = c.model.hidden_size.value_or(0);
  s.n = c.model.num_attention_heads.value_or(1);
  s.d = c.model.kv_channels.value_or(s.h / std::max<int64_t>(1, s.n));
  s.g = effective_query_groups(c);
  s.F = c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(s.h, c.model.swiglu));
  s.Fmoe = c.moe.moe_ffn_hidden_size.value_or(s.F);
  s.E = c.moe.num_experts.value_or(0);
  s.topk = c.moe.moe_router_topk;
  s.V = c.derived.padded_vocab_size;
  s.norm = c.model.normalization == "RMSNorm" ? 1 : 2;  // weight (+ bias)
  s.bias = c.model.disable_bias_linear ? 0 : 1;
  s.qkv_bias = s.bias || c.model.add_qkv_bias ? 1 : 0;
  s.mlp_mult = gated_mlp(c.model) ? 2 : 1;                  // fc1 holds gate and up with SwiGLU
  s.shared = c.moe.moe_shared_expert_intermediate_size.value_or(0);
  s.sinks = c.model.softmax_type == "learnable" ? 1 : 0;  // (a learned sink logit per head)
  return s;
}

// Multi-latent attention's parameters on one of tp ranks (the down projections and the latents' norms whole on each).
int64_t mla_attention_params(const Config& c, const Shapes& s, int64_t tp) {
  const ModelConfig& m = c.model;
  const int64_t dq = m.qk_head_dim + m.qk_pos_emb_head_dim, Rkv = m.kv_lora_rank, norms = m.qk_layernorm ? s.norm : 0;
  int64_t p = m.q_lora_rank ? *m.q_lora_rank * s.h + norms * *m.q_lora_rank + s.n * dq * *m.q_lora_rank / tp : s.h * s.n * dq / tp;
  p += (Rkv + m.qk_pos_emb_head_dim) * s.h + norms * Rkv + s.n * (m.qk_head_dim + m.v_head_dim) * Rkv / tp;
  p += s.n * m.v_head_dim * s.h / tp + s.bias * s.h + s.sinks * s.n / tp;
  return p + s.norm * s.h;  // input norm
}

int64_t attention_params(const Shapes& s, bool qk_norm) {
  const int64_t qkv_out = s.n * s.d + 2 * s.g * s.d;
  int64_t p = s.h * qkv_out + s.qkv_bias * qkv_out + s.n * s.d * s.h + s.bias * s.h + s.sinks * s.n;
  if (qk_norm) p += 2 * s.norm * s.d;
  return p + s.norm * s.h;  // input norm
}

int64_t mlp_params(const Shapes& s, int64_t F) {
  return s.h * F * s.mlp_mult + s.bias * F * s.mlp_mult + F * s.h + s.bias * s.h;
}

}  // namespace

ParamCounts count_params(const Config& c) {
  const Shapes s = shapes_of(c);
  ParamCounts p;
  const int64_t L = c.model.num_layers.value_or(0);
  p.embedding = s.V * s.h;
  if (c.model.position_embedding_type == "learned_absolute") p.position = c.model.max_position_embeddings.value_or(0) * s.h;
  if (c.model.untie_embeddings_and_output_weights) p.output = s.V * s.h;
  const int64_t attn = c.model.multi_latent_attention ? mla_attention_params(c, s, 1) : attention_params(s, c.model.qk_layernorm);
  p.dense_layer = attn + s.norm * s.h + mlp_params(s, s.F);
  const int64_t router = s.h * s.E + s.bias * s.E;  // the router's bias with --add-bias-linear (Megatron 2025)
  const int64_t shared = s.shared ? mlp_params(s, s.shared) + (c.moe.moe_shared_expert_gate ? s.h : 0) : 0;  // (its gate: [1, h])
  p.moe_layer = attn + s.norm * s.h + router + s.E * mlp_params(s, s.Fmoe) + shared;
  p.final_norm = s.norm * s.h;
  for (int64_t l = 0; l < L; ++l) (is_moe_layer(c, l) ? p.num_moe_layers : p.num_dense_layers) += 1;
  const int64_t head = p.embedding + p.position + p.output + p.final_norm;
  // Multi-token prediction: per module three norms and the projection [h, 2h] (mtp_module), and a layer of the last
  // layer's kind (the embedding and output layer shared).
  p.mtp_layers = c.model.mtp_num_layers.value_or(0);
  p.mtp_module = 3 * s.norm * s.h + 2 * s.h * s.h;
  const bool mtp_moe = L > 0 && is_moe_layer(c, L - 1);
  const int64_t mtp = p.mtp_layers * (p.mtp_module + (mtp_moe ? p.moe_layer : p.dense_layer));
  p.total = head + p.dense_layer * p.num_dense_layers + p.moe_layer * p.num_moe_layers + mtp;
  const int64_t moe_active = attn + s.norm * s.h + router + std::min(s.topk, s.E) * mlp_params(s, s.Fmoe) + shared;
  p.active = head + p.dense_layer * p.num_dense_layers + moe_active * p.num_moe_layers +
             p.mtp_layers * (p.mtp_module + (mtp_moe ? moe_active : p.dense_layer));
  return p;
}

RankParams params_on_rank(const Config& c, int64_t stage) {
  const Shapes s = shapes_of(c);
  const int64_t tp = c.parallel.tensor_model_parallel_size;
  const int64_t ep = c.parallel.expert_model_parallel_size;
  const int64_t etp = c.parallel.expert_tensor_parallel_size.value_or(tp);
  const int64_t pp = c.parallel.pipeline_model_parallel_size;
  const auto stages = layers_per_pipeline_stage(c);
  int64_t first_layer = 0;
  for (int64_t st = 0; st < stage; ++st) first_layer += stages[static_cast<size_t>(st)];
  RankParams r;
  // Column-parallel outputs and row-parallel inputs are split over TP; norms and row-parallel biases
  // are replicated.
  // With fewer query groups than TP, each rank holds its group's whole QKV block (the group's query heads
  // and its K/V), replicated on TP / groups ranks (gpt_model.cpp's K/V replication).
  const int64_t qkv_local = s.g >= tp ? (s.n * s.d + 2 * s.g * s.d) / tp : (s.n / s.g + 2) * s.d;
  int64_t attn = s.h * qkv_local + s.qkv_bias * qkv_local + (s.n * s.d / tp) * s.h + s.bias * s.h + s.norm * s.h + s.sinks * s.n / tp;
  if (c.model.qk_layernorm) attn += 2 * s.norm * s.d;
  if (c.model.multi_latent_attention) attn = mla_attention_params(c, s, tp);
  auto mlp_local = [&](int64_t F, int64_t t) {
    return s.h * (F / t) * s.mlp_mult + s.bias * (F / t) * s.mlp_mult + (F / t) * s.h + s.bias * s.h;
  };
  for (int64_t l = first_layer; l < first_layer + stages[static_cast<size_t>(stage)]; ++l) {
    r.dense += attn + s.norm * s.h;
    if (is_moe_layer(c, l)) {
      r.dense += s.h * s.E + s.bias * s.E;  // router, replicated
      if (s.shared) r.dense += mlp_local(s.shared, tp);
      r.expert += (s.E / std::max<int64_t>(1, ep)) * mlp_local(s.Fmoe, etp);
    } else {
      r.dense += mlp_local(s.F, tp);
    }
  }
  const bool first = stage == 0, last = stage == pp - 1;
  if (first) {
    r.dense += s.V * s.h / tp;
    if (c.model.position_embedding_type == "learned_absolute") r.dense += c.model.max_position_embeddings.value_or(0) * s.h;
  }
  if (last) {
    r.dense += s.norm * s.h;
    // Multi-token prediction's modules (on the last stage): norms and the projection whole on every TP rank, a layer of the
    // last layer's kind
    const int64_t L = c.model.num_layers.value_or(0);
    // (their copy of the word embeddings on a last stage that has none: untied, under pipeline parallelism)
    if (c.model.mtp_num_layers && c.model.untie_embeddings_and_output_weights && pp > 1) r.dense += s.V * s.h / tp;
    for (int64_t k = 0; k < c.model.mtp_num_layers.value_or(0); ++k) {
      r.dense += 3 * s.norm * s.h + 2 * s.h * s.h + attn + s.norm * s.h;
      if (L > 0 && is_moe_layer(c, L - 1)) {
        r.dense += s.h * s.E + s.bias * s.E;
        if (s.shared) r.dense += mlp_local(s.shared, tp);
        r.expert += (s.E / std::max<int64_t>(1, ep)) * mlp_local(s.Fmoe, etp);
      } else {
        r.dense += mlp_local(s.F, tp);
      }
    }
    // The output layer: its own weight when untied; a copy of the embedding on the last stage when tied and PP > 1.
    if (c.model.untie_embeddings_and_output_weights || pp > 1) r.dense += s.V * s.h / tp;
  }
  return r;
}

}  // namespace mt
