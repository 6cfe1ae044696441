// model_identity.cpp: the architecture settings, compared by value.
#include "config/model_identity.h"

#include "config/errors.h"
#include "config/layer_pattern.h"
#include "config/moe_pattern.h"

#include <sstream>

#include "config/resolve.h"

namespace mt {
namespace {

std::string text(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
std::string text(int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(const std::string& v) { return v; }
std::string text(const OptInt& v) { return v ? std::to_string(*v) : "unset"; }

}  // namespace

std::vector<std::pair<std::string, std::string>> model_identity(const Config& c) {
  const auto& m = c.model;
  const bool rope = m.position_embedding_type == "rope" || m.position_embedding_type == "yarn";
  std::vector<std::pair<std::string, std::string>> out = {
      {"num-layers", text(m.num_layers)},
      {"hidden-size", text(m.hidden_size)},
      {"ffn-hidden-size", text(m.ffn_hidden_size)},
      {"num-attention-heads", text(m.num_attention_heads)},
      {"kv-channels", text(m.kv_channels)},
      {"num-query-groups", text(effective_query_groups(c))},
      {"swiglu", text(m.swiglu)},
      {"normalization", text(m.normalization)},
      {"position-embedding-type", text(m.position_embedding_type)},
      {"untie-embeddings-and-output-weights", text(m.untie_embeddings_and_output_weights)},
      {"disable-bias-linear", text(m.disable_bias_linear)},
      {"qk-layernorm", text(m.qk_layernorm)},
      {"squared-relu", text(m.squared_relu)},
      {"quick-geglu", text(m.quick_geglu)},
      {"glu-linear-offset", text(m.glu_linear_offset)},
      {"activation-func-clamp-value", m.activation_func_clamp_value ? text(*m.activation_func_clamp_value) : "unset"},
      // (the sinks: off-by-one has no tensor to tell it from vanilla. Not YaRN's settings: like position interpolation,
      // changing them is how a trained model's context is extended)
      {"softmax-type", m.softmax_type},
      {"rotary-interleaved", text(m.rotary_interleaved)},
      {"apply-layernorm-1p", text(m.apply_layernorm_1p)},
      {"num-experts", text(c.moe.num_experts)},
  };
  if (rope) {
    out.emplace_back("rotary-base", text(m.rotary_base));
    out.emplace_back("rotary-percent", text(m.rotary_percent));
    out.emplace_back("use-rope-scaling", text(m.use_rope_scaling));
    std::string skipped;  // (--no-rope-freq, as the layers it names: "" without it)
    try {
      for (bool b : rope_skipped_layers(c)) skipped += b ? '1' : '0';
    } catch (const ConfigError&) {
      skipped = m.no_rope_freq.value_or("");
    }
    out.emplace_back("no-rope-freq", skipped);
    if (m.use_rope_scaling) out.emplace_back("rope-scaling-factor", text(m.rope_scaling_factor));
    // (not --rotary-seq-len-interpolation-factor: position interpolation is how a trained model's context is extended,
    // by continuing from its checkpoint with the factor, so a change of it is the run's to make)
  } else {
    out.emplace_back("max-position-embeddings", text(m.max_position_embeddings));
    // (multi-latent attention rotates its own part beside learned positions or none)
    if (m.multi_latent_attention) out.emplace_back("rotary-base", text(m.rotary_base));
  }
  out.emplace_back("add-qkv-bias", text(m.add_qkv_bias && m.disable_bias_linear && !m.multi_latent_attention));  // (only where it adds parameters)
  out.emplace_back("multi-latent-attention", text(m.multi_latent_attention));
  if (m.multi_latent_attention) {  // (not --rope-type: YaRN's RoPE over plain RoPE is how a context is extended, as above)
    out.emplace_back("q-lora-rank", text(m.q_lora_rank));
    out.emplace_back("kv-lora-rank", text(m.kv_lora_rank));
    out.emplace_back("qk-head-dim", text(m.qk_head_dim));
    out.emplace_back("qk-pos-emb-head-dim", text(m.qk_pos_emb_head_dim));
    out.emplace_back("v-head-dim", text(m.v_head_dim));
  }
  if (c.moe.num_experts) {
    out.emplace_back("moe-router-topk", text(c.moe.moe_router_topk));
    out.emplace_back("moe-ffn-hidden-size", text(c.moe.moe_ffn_hidden_size));
    std::string pattern;
    for (bool m : moe_layer_pattern(c)) pattern += m ? '1' : '0';
    out.emplace_back("moe-layer-freq", pattern);
    out.emplace_back("moe-shared-expert-intermediate-size", text(c.moe.moe_shared_expert_intermediate_size));
    if (c.moe.moe_shared_expert_intermediate_size) out.emplace_back("moe-shared-expert-gate", text(c.moe.moe_shared_expert_gate));
  }
  return out;
}

std::vector<std::string> model_identity_differences(const Config& saved, const Config& run) {
  const auto a = model_identity(saved), b = model_identity(run);
  std::vector<std::string> out;
  for (const auto& [name, value] : b) {
    std::string was = "absent";
    for (const auto& [n, v] : a) {
      if (n == name) was = v;
    }
    if (was != value) out.push_back("--" + name + ": checkpoint " + was + ", this run " + value);
  }
  return out;
}

}  // namespace mt
