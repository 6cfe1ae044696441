// model_dims.cpp: the decoder's sizes per TP rank and the dropout keys.
#include "model/model_dims.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "config/attention_window.h"
#include "config/layer_pattern.h"
#include "config/resolve.h"
#include "tensor/rng.h"

namespace mt {

RopeScaling yarn_scaling(const ModelConfig& m) {
  return RopeScaling{.yarn_factor = m.rotary_scaling_factor,
                     .yarn_original_max_positions = static_cast<double>(m.yarn_original_max_position_embeddings.value_or(4096)),
                     .yarn_beta_fast = m.yarn_beta_fast.value_or(32.0),
                     .yarn_beta_slow = m.yarn_beta_slow.value_or(1.0),
                     .yarn_mscale = m.mscale,
                     .yarn_mscale_all_dim = m.mscale_all_dim,
                     .yarn_round_to_int = !m.no_yarn_correction_range_round_to_int};
}

ModelDims model_dims(const Config& c, int64_t tp_rank, int64_t tp, int64_t ep_rank, int64_t ep, int64_t etp_rank, int64_t etp) {
  ModelDims d{};
  d.L = *c.model.num_layers;
  d.h = *c.model.hidden_size;
  d.nh = *c.model.num_attention_heads;
  d.ng = effective_query_groups(c);
  d.d = c.model.kv_channels.value_or(d.h / d.nh);
  d.F = c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(d.h, c.model.swiglu));
  d.V = c.derived.padded_vocab_size;
  d.S = *c.data.seq_length;
  d.max_pos = c.model.max_position_embeddings.value_or(d.S);
  d.tp = tp;
  d.tp_rank = tp_rank;
  d.nh_local = d.nh / tp;
  d.ng_local = std::max<int64_t>(1, d.ng / tp);
  d.kv_rep = d.ng < tp ? tp / d.ng : 1;
  d.qh_local = d.ng_local * (d.nh / d.ng);
  d.F_local = d.F / tp;
  d.V_local = d.V / tp;
  d.rms = c.model.normalization == "RMSNorm";
  d.norm_1p = c.model.apply_layernorm_1p;
  d.per_token_loss = c.training.calculate_per_token_loss;
  d.swiglu = gated_mlp(c.model);
  d.glu = GatedActivation{.alpha = c.model.quick_geglu ? kQuickGeluAlpha : 1.0f,
                          .linear_offset = static_cast<float>(c.model.glu_linear_offset),
                          .clamp = static_cast<float>(c.model.activation_func_clamp_value.value_or(0.0))};
  d.bias = !c.model.disable_bias_linear;
  d.qkv_bias = d.bias || c.model.add_qkv_bias;
  d.rope = c.model.position_embedding_type == "rope" || c.model.position_embedding_type == "yarn";
  d.learned_pos = c.model.position_embedding_type == "learned_absolute";
  d.tied = !c.model.untie_embeddings_and_output_weights;
  d.sequence_parallel = c.parallel.sequence_parallel && tp > 1;
  d.qk_norm = c.model.qk_layernorm;
  d.squared_relu = c.model.squared_relu;
  d.gelu_erf = !d.swiglu && !c.model.squared_relu && (c.model.no_bias_gelu_fusion || c.model.disable_bias_linear);
  d.rotary_interleaved = c.model.rotary_interleaved;
  d.eps = static_cast<float>(c.model.norm_epsilon);
  d.rope_base = static_cast<float>(c.model.rotary_base);
  d.rope_skipped = rope_skipped_layers(c);
  d.windows = attention_windows(c);
  d.sink = c.model.softmax_type == "learnable"    ? ModelDims::Sink::kLearnable
           : c.model.softmax_type == "off-by-one" ? ModelDims::Sink::kOffByOne
                                                  : ModelDims::Sink::kNone;
  d.rope_scaling = RopeScaling{.factor = c.model.use_rope_scaling ? c.model.rope_scaling_factor : 0.0,
                               .position_interpolation = static_cast<double>(c.model.rotary_seq_len_interpolation_factor.value_or(1))};
  if (c.model.position_embedding_type == "yarn") d.rope_scaling = yarn_scaling(c.model);
  d.hidden_dropout = static_cast<float>(c.model.hidden_dropout);
  d.attention_dropout = static_cast<float>(c.model.attention_dropout);
  // Query-key layer scaling divides the scores by the layer number and the softmax multiplies it back:
  // identical in fp32 math, so the reference applies the plain 1/sqrt(d).
  d.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d.d));
  d.rot_dim = static_cast<int64_t>(static_cast<double>(d.d) * c.model.rotary_percent);
  d.rot_dim -= d.rot_dim % 2;
  if (c.model.multi_latent_attention) {
    // Megatron's MLASelfAttention: the query / key heads qk_head_dim + qk_pos_emb_head_dim wide, the values v_head_dim;
    // RoPE over the qk_pos_emb_head_dim part only (YaRN's by default, rope with --rope-type rope); the softmax scale
    // mscale^2 / sqrt(d) with YaRN's mscale of --rotary-scaling-factor and --mscale-all-dim, whatever the RoPE.
    d.mla = true;
    d.q_lora_rank = c.model.q_lora_rank.value_or(0);
    d.kv_lora_rank = c.model.kv_lora_rank;
    d.qk_nope = c.model.qk_head_dim;
    d.qk_rope = c.model.qk_pos_emb_head_dim;
    d.v_dim = c.model.v_head_dim;
    d.d = d.qk_nope + d.qk_rope;
    d.ng = d.nh;
    d.ng_local = d.nh_local;
    d.kv_rep = 1;
    d.qh_local = d.nh_local;
    d.rot_dim = d.qk_rope;
    d.rope_scaling = c.model.rope_type.value_or("yarn") == "yarn" ? yarn_scaling(c.model) : RopeScaling{};
    const double f = c.model.rotary_scaling_factor, mscale = f <= 1 ? 1.0 : 0.1 * c.model.mscale_all_dim * std::log(f) + 1.0;
    d.softmax_scale = static_cast<float>(mscale * mscale / std::sqrt(static_cast<double>(d.d)));
    d.qkv_bias = false;  // (Megatron's MLA projections have no biases; the output projection's follows --disable-bias-linear)
  }
  if (c.model.mtp_num_layers) {
    d.mtp = *c.model.mtp_num_layers;
    d.mtp_loss_scale = static_cast<float>(c.model.mtp_loss_scaling_factor / static_cast<double>(d.mtp));
  }
  d.cp = c.parallel.context_parallel_size;
  d.cp_a2a = c.parallel.cp_comm_type == "a2a";
  const auto& pr = c.precision;
  d.fp8 = pr.fp8_format.has_value();
  d.fp8_grad_e5m2 = pr.fp8_format.value_or("") == "hybrid";
  d.fp8_wgrad = !(pr.no_fp8_wgrad && pr.fp8_recipe == "delayed");  // Megatron overrides the wgrad precision for delayed only
  d.fp8_delayed = d.fp8 && pr.fp8_recipe == "delayed";
  d.fp8_blockwise = d.fp8 && pr.fp8_recipe == "blockwise";
  d.fp8_max_algo = pr.fp8_amax_compute_algo == "max";
  d.fp8_history_len = pr.fp8_amax_history_len;
  d.fp8_margin = pr.fp8_margin;
  d.fp8_amax_over_dp = !pr.tp_only_amax_red;
  if (pr.first_last_layers_bf16) {
    d.fp8_bf16_start = pr.num_layers_at_start_in_bf16;
    d.fp8_bf16_end = pr.num_layers_at_end_in_bf16;
  }
  if (c.moe.num_experts) {
    d.experts = *c.moe.num_experts;
    d.topk = c.moe.moe_router_topk;
    d.F_moe = c.moe.moe_ffn_hidden_size.value_or(d.F);
    d.ep = ep;
    d.ep_rank = ep_rank;
    d.etp = etp;
    d.etp_rank = etp_rank;
    d.experts_local = d.experts / ep;
    d.F_moe_local = d.F_moe / etp;
    d.F_shared = c.moe.moe_shared_expert_intermediate_size.value_or(0);
    d.F_shared_local = d.F_shared / tp;
  }
  return d;
}

uint64_t dropout_key(uint64_t seed, int64_t step, int64_t sample, int64_t layer, int site) {
  const std::string k = std::to_string(step) + "/" + std::to_string(sample) + "/" + std::to_string(layer) + "/" +
                        std::to_string(site);
  return rng_key(seed, k);
}

}  // namespace mt
