// hf_export.cpp: the checkpoint is loaded into a one-rank CPU model (the loader reshards any saved layout),
// then each HF tensor is built from megatrain's global tensors by name.
#include "interop/hf_export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "config/errors.h"
#include "config/moe_pattern.h"
#include "config/resolve.h"
#include "config/yaml_io.h"
#include "interop/hf_layout.h"
#include "interop/safetensors.h"
#include "kernels/rope_frequencies.h"
#include "model/model_dims.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "tensor/dtype.h"

namespace mt {
namespace fs = std::filesystem;
namespace {

using hf::HfMoeNames;
using hf::SplitQkv;
using hf::hf_moe_names;
using hf::Values;
using hf::split_qkv;
using hf::transposed;

// HF's router_aux_loss_coef (its one load-balancing loss, the batch's): the coefficient of the first auxiliary loss
// trained with (aux_loss, seq_aux_loss, global_aux_loss in that order), 0 without one. Training metadata only.
double router_aux_loss_coef(const MoeConfig& mc) {
  for (const char* type : kAuxLossTypes) {
    if (mc.aux_loss_coeff(type) > 0) return mc.aux_loss_coeff(type);
  }
  return 0.0;
}

// --rotary-interleaved rotates the pairs (2i, 2i + 1) of each head; HF rotates (i, i + d/2): each head's rows
// reordered so that HF's rotation meets the same pairs.
Values deinterleave_heads(const Values& w, int64_t heads, int64_t d, int64_t cols) {
  Values out(w.size());
  for (int64_t hd = 0; hd < heads; ++hd) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t src = j < d / 2 ? 2 * j : 2 * (j - d / 2) + 1;
      std::copy_n(w.begin() + (hd * d + src) * cols, cols, out.begin() + (hd * d + j) * cols);
    }
  }
  return out;
}

struct Exported {
  std::string name;
  std::vector<int64_t> shape;
  Values values;
  bool fp32 = false;  // written in fp32 whatever --dtype says (HF's _keep_in_fp32_modules: GLM's e_score_correction_bias)
};

}  // namespace

SingleRankModel load_single_rank(const std::string& dir, std::optional<int64_t> step) {
  SingleRankModel out;
  out.info = checkpoint_info(dir, step);
  Config& c = out.cfg;
  apply_yaml_text(c, out.info.config_yaml, "checkpoint config");
  // One rank, fp32 weights: the loader reshards the saved layout into it; no bf16 working copy, so the
  // parameters are the saved master weights exactly.
  c.parallel = ParallelConfig{};
  c.training.use_distributed_optimizer = false;
  c.training.overlap_grad_reduce = false;
  c.training.overlap_param_gather = false;
  c.precision.bf16 = c.precision.fp16 = false;
  c.precision.fp8_format.reset();
  c.recompute = RecomputeConfig{};
  c.checkpoint = CheckpointConfig{};
  c.training.global_batch_size.reset();
  c.training.rampup_batch_size.clear();
  resolve(c, 1, out.info.vocab_size);
  const auto emb = out.info.shapes.find("embedding.word_embeddings.weight");
  if (emb == out.info.shapes.end()) throw DataError(out.info.dir + " has no embedding.word_embeddings.weight: not a megatrain model checkpoint");
  c.derived.padded_vocab_size = emb->second.at(0);  // the vocabulary padding the run trained with
  out.model = std::make_unique<GPTModel>(c, ProcessGroups::single());
  Optimizer opt(c, out.model->params(), ProcessGroups::single());
  LossScaler scaler(c);
  LoadOptions lo;
  lo.step = out.info.iteration;
  lo.load_optimizer = false;
  lo.finetune = true;
  lo.vocab_size = out.info.vocab_size;
  load_checkpoint(dir, lo, out.model->params(), opt, scaler);
  return out;
}

std::vector<std::string> export_hf(const HfExportOptions& opt) {
  if (opt.dtype != "bf16" && opt.dtype != "fp32") throw ConfigError("--dtype must be bf16 or fp32, got " + opt.dtype);
  SingleRankModel m = load_single_rank(opt.checkpoint_dir, opt.step);
  const Config& c = m.cfg;
  const ModelDims D = model_dims(c, 0, 1);
  ParamStore& ps = m.model->params();
  auto get = [&](const std::string& name) {
    const size_t i = ps.index_of(name);
    if (i == kNoParam) throw DataError("the checkpoint's model has no " + name);
    return Values(ps.param(i), ps.param(i) + ps.info(i).numel);
  };
  auto has = [&](const std::string& name) {  // (index_of throws for a missing name)
    return std::any_of(ps.infos().begin(), ps.infos().end(), [&](const ParamInfo& p) { return p.name == name; });
  };
  std::vector<std::string> notes;
  auto refuse = [](bool bad, const std::string& why) {
    if (bad) throw ConfigError("cannot export to HuggingFace: " + why);
  };
  refuse(D.squared_relu, "--squared-relu has no place in the exported families");
  refuse(std::find(D.rope_skipped.begin(), D.rope_skipped.end(), true) != D.rope_skipped.end(),
         "--no-rope-freq (layers without RoPE) has no place in the exported families (LLaMA, Qwen, Mixtral, GLM rotate in every layer)");
  refuse(c.moe.num_experts && c.moe.moe_apply_probs_on_input,
         "--moe-apply-probs-on-input weighs the experts' inputs; HF's MoE blocks weigh their outputs (another function)");
  const std::vector<bool> moe = moe_layer_pattern(c);
  const bool any_moe = D.experts > 0 && std::find(moe.begin(), moe.end(), true) != moe.end();
  std::string family;
  // (quick GeGLU with its offset and clamp, attention sinks: GPT-OSS's pieces, which only its HF form holds)
  const bool gpt_oss_parts = (D.swiglu && !D.glu.plain_swiglu()) || D.sink != ModelDims::Sink::kNone;
  if (D.mla) {  // (multi-latent attention: DeepSeek-V3's DeepseekV3ForCausalLM, a GLM-4.5-style sigmoid-routed MoE or none)
    refuse(!D.rope, "DeepseekV3ForCausalLM has no learned position embeddings and its attention rotates: the model needs "
                    "--position-embedding-type rope (it has " + c.model.position_embedding_type + ")");
    refuse(!(D.swiglu && D.rms && D.rope && D.glu.plain_swiglu()), "multi-latent attention has a HuggingFace form only as DeepseekV3ForCausalLM: "
                                                                   "RMSNorm and SwiGLU");
    refuse(any_moe && c.moe.moe_router_score_function != "sigmoid", "DeepseekV3ForCausalLM's router takes sigmoid scores "
                                                                    "(--moe-router-score-function sigmoid)");
    refuse(D.q_lora_rank == 0, "DeepseekV3ForCausalLM without q_lora_rank norms the keys' latent alone, which Megatron's MLA cannot (its "
                               "--qk-layernorm norms both latents): this model has no query latent (--q-lora-rank)");
    refuse(!D.qk_norm, "DeepseekV3ForCausalLM norms both latents (q_a_layernorm, kv_a_layernorm): the model needs --qk-layernorm");
    refuse(c.model.norm_epsilon != 1e-6, "DeepseekV3ForCausalLM's latent norms keep eps 1e-6 whatever rms_norm_eps: the model needs "
                                         "--norm-epsilon 1e-6");
    refuse(D.bias, "DeepseekV3ForCausalLM has no biases (--disable-bias-linear)");
    refuse(c.model.rope_type.value_or("yarn") == "rope" && (c.model.rotary_scaling_factor != 1.0 || c.model.mscale_all_dim != 0.0),
           "--rope-type rope with --rotary-scaling-factor / --mscale-all-dim scales MLA's softmax without YaRN's RoPE: HF's DeepSeek-V3 "
           "scales it only with rope_scaling");
    family = "deepseek_v3";
  } else if (gpt_oss_parts) {
    refuse(!(D.rms && D.rope && any_moe), "quick GeGLU (or a GLU offset or clamp) and attention sinks have a HuggingFace form only as "
                                          "GptOssForCausalLM: RMSNorm, RoPE and an MoE MLP in every layer");
    family = "gpt_oss";
  } else if (!D.swiglu && !D.rms && D.learned_pos) family = "gpt2";
  // (--qk-layernorm: Qwen3's per-head RMSNorms of the queries and keys before RoPE, and Qwen3-MoE's)
  else if (D.swiglu && D.rms && D.rope && !any_moe) family = D.qk_norm ? "qwen3" : "llama";
  // (sigmoid routers, with or without the expert bias: GLM-4.5's Glm4MoeForCausalLM, its e_score_correction_bias)
  else if (D.swiglu && D.rms && D.rope && any_moe && c.moe.moe_router_score_function == "sigmoid") family = "glm4_moe";
  else if (D.swiglu && D.rms && D.rope && any_moe) family = D.qk_norm ? "qwen3_moe" : D.F_shared > 0 ? "qwen2_moe" : "mixtral";
  refuse(family.empty(), "the model is neither GPT-2 shaped (LayerNorm, GELU, learned positions) nor LLaMA / Mixtral / Qwen3 shaped "
                         "(RMSNorm, SwiGLU, RoPE)");
  refuse(family == "gpt2" && D.qk_norm, "--qk-layernorm has no place in GPT2LMHeadModel");
  // (GLM-4.5's MoE block is DeepSeek-V3's: the checks and tensors below serve both)
  const bool deepseek = family == "deepseek_v3", glm = family == "glm4_moe" || deepseek;
  const std::string moe_arch = deepseek ? "DeepseekV3ForCausalLM" : "Glm4MoeForCausalLM";
  // Sliding-window attention (--window-size L,0): HF's sliding_window L + 1 (its mask keeps keys kv > q - W). Mistral's and
  // Mixtral's window every layer; Qwen3's name the layers in layer_types.
  const bool windowed = std::any_of(D.windows.begin(), D.windows.end(), [](int64_t w) { return w >= 0; });
  const bool every_layer_windowed = windowed && std::all_of(D.windows.begin(), D.windows.end(), [](int64_t w) { return w >= 0; });
  const int64_t window_left = windowed ? *std::max_element(D.windows.begin(), D.windows.end()) : -1;
  refuse(windowed && family != "llama" && family != "mixtral" && family != "qwen3" && family != "qwen3_moe" && family != "gpt_oss",
         "sliding-window attention (--window-size) has no place in " + family + "'s HF form (Mistral, Mixtral, Qwen3 and GPT-OSS have it)");
  refuse(windowed && std::any_of(D.windows.begin(), D.windows.end(), [&](int64_t w) { return w >= 0 && w != window_left; }),
         "windows of different sizes in different layers: HF's sliding_window is one size");
  refuse(windowed && (family == "llama" || family == "mixtral" || family == "qwen3_moe") && !every_layer_windowed,
         "--window-attn-skip-freq: MistralForCausalLM, MixtralForCausalLM and Qwen3MoeForCausalLM window every layer (Qwen3's dense form "
         "names them: --qk-layernorm without experts)");
  refuse(windowed && family == "llama" && (D.qkv_bias || D.bias), "sliding-window attention with biases: MistralForCausalLM has none");
  refuse(!glm && c.model.rotary_percent != 1.0, "--rotary-percent below 1 (partial rotary) has no place in " +
                                                    std::string(family == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM") +
                                                    " (GLM-4.5's Glm4MoeForCausalLM, a sigmoid-routed MoE, has it)");
  refuse(glm && D.rotary_interleaved && D.rot_dim < D.d, "--rotary-interleaved with partial rotary has no place in Glm4MoeForCausalLM");
  if (glm) {  // GLM-4.5's MoE block: sigmoid scores (+ e_score_correction_bias for the choice), the top k renormalised, scaled
    const MoeConfig& mc = c.moe;
    refuse(D.bias, moe_arch + " has no biases but its QKV ones (--disable-bias-linear, with --add-qkv-bias or not)");
    refuse(!mc.load_balancing_is("aux_loss") && !mc.load_balancing_is("seq_aux_loss") && !mc.load_balancing_is("global_aux_loss") &&
               !mc.load_balancing_is("none") && mc.moe_router_load_balancing_type.size() == 1,
           moe_arch + " routes by the top k of the sigmoid scores (plus its bias): no sinkhorn or quantile balancing");
    refuse(mc.moe_expert_capacity_factor.has_value(), moe_arch + " is dropless (no --moe-expert-capacity-factor)");
    refuse(mc.moe_shared_expert_gate, moe_arch + "'s shared experts have no gate (--moe-shared-expert-gate)");
    refuse(D.F_shared > 0 && D.F_shared % D.F_moe != 0, moe_arch + "'s shared experts are n_shared_experts x --moe-ffn-hidden-size wide: "
                                                         "--moe-shared-expert-intermediate-size must be a multiple of it");
    refuse(mc.moe_router_num_groups.value_or(1) > mc.moe_router_group_topk.value_or(1) && D.topk / mc.moe_router_group_topk.value_or(1) != 2,
           moe_arch + " scores each expert group by its best two experts: group-limited routing needs --moe-router-topk = 2 x "
           "--moe-router-group-topk");
    bool dense_prefix = true;
    for (int64_t l = 1; l < D.L; ++l) dense_prefix = dense_prefix && (moe[static_cast<size_t>(l)] || !moe[static_cast<size_t>(l - 1)]);
    refuse(!dense_prefix, moe_arch + "'s dense layers are its first ones (first_k_dense_replace): --moe-layer-freq must be dense "
                          "layers, then MoE layers");
  }
  if (family == "gpt_oss") {  // GptOssForCausalLM: its experts' clamped quick GeGLU with the offset 1, learned sinks, biases, a softmax router
    const MoeConfig& mc = c.moe;
    refuse(D.glu.alpha != kQuickGeluAlpha || D.glu.linear_offset != 1.0f || D.glu.clamp <= 0.0f,
           "GptOssForCausalLM's experts compute quick GELU of the clamped gate times (the clamped up + 1): --quick-geglu --glu-linear-offset 1 "
           "--activation-func-clamp-value, all three");
    refuse(D.sink != ModelDims::Sink::kLearnable, "GptOssForCausalLM has learned attention sinks (--softmax-type learnable)");
    refuse(!D.bias, "GptOssForCausalLM has biases in every linear layer, its router's and experts' too (no --disable-bias-linear)");
    refuse(std::find(moe.begin(), moe.end(), false) != moe.end() || D.F_shared > 0,
           "GptOssForCausalLM has an MoE MLP in every layer (--moe-layer-freq 1) and no shared experts");
    refuse(mc.moe_router_score_function != "softmax" || mc.moe_router_pre_softmax || mc.moe_router_topk_scaling_factor.has_value() ||
               mc.moe_router_num_groups.has_value() || mc.moe_router_enable_expert_bias || mc.load_balancing_is("quantile_balancing") ||
               mc.load_balancing_is("sinkhorn"),
           "GptOssForCausalLM's router is a softmax over the top-k logits: no --moe-router-pre-softmax, sigmoid scores, scaling factor, "
           "groups, expert bias, sinkhorn or quantile balancing");
    refuse(mc.moe_expert_capacity_factor.has_value(), "GptOssForCausalLM is dropless (no --moe-expert-capacity-factor)");
    refuse(D.qk_norm, "GptOssForCausalLM has no query-key norms (--qk-layernorm)");
    refuse(D.rotary_interleaved, "GptOssForCausalLM rotates halves (no --rotary-interleaved)");
  }
  refuse(family != "gpt_oss" && D.sink != ModelDims::Sink::kNone, "attention sinks (--softmax-type) have a HF form only in GptOssForCausalLM");
  if (family == "qwen2_moe") {
    refuse(!c.moe.moe_shared_expert_gate,
           "a Mixtral-shaped model with a shared expert is Qwen2-MoE's, whose shared expert has a gate (--moe-shared-expert-gate): this model "
           "was trained without it");
    refuse(!D.qkv_bias || D.bias, "Qwen2-MoE's attention has QKV biases and no other (--disable-bias-linear --add-qkv-bias): this model "
                                  "was trained otherwise");
  }
  const bool qwen3 = family == "qwen3" || family == "qwen3_moe";
  const int64_t L = D.L, h = D.h, nh = D.nh, ng = D.ng, d = D.d, V = c.derived.padded_vocab_size;
  std::vector<Exported> out;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, Values v) { out.push_back({name, std::move(shape), std::move(v)}); };
  auto norm = [&](const std::string& name) {  // the scale a norm applies: --apply-layernorm-1p keeps 1 + weight's weight
    Values v = get(name);
    if (D.norm_1p) {
      for (float& x : v) x += 1.0f;
    }
    return v;
  };
  nlohmann::ordered_json config;
  const std::string dtype_name = opt.dtype == "bf16" ? "bfloat16" : "float32";
  if (family == "gpt2") {
    refuse(ng != nh, "GPT-2 has no grouped-query attention (--num-query-groups)");
    refuse(d * nh != h, "GPT-2's head dimension is the hidden size over the heads (--kv-channels differs)");
    refuse(D.rope, "GPT-2 has learned positions, not RoPE");
    put("transformer.wte.weight", {V, h}, get("embedding.word_embeddings.weight"));
    put("transformer.wpe.weight", {D.max_pos, h}, get("embedding.position_embeddings.weight"));
    auto bias_or_zero = [&](const std::string& name, int64_t n) { return has(name) ? get(name) : Values(static_cast<size_t>(n), 0.0f); };
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".", o = "transformer.h." + std::to_string(l) + ".";
      put(o + "ln_1.weight", {h}, norm(p + "input_norm.weight"));
      put(o + "ln_1.bias", {h}, get(p + "input_norm.bias"));
      const SplitQkv w = split_qkv(get(p + "attention.qkv.weight"), nh, ng, d, h);
      Values qkv = w.q;
      qkv.insert(qkv.end(), w.k.begin(), w.k.end());
      qkv.insert(qkv.end(), w.v.begin(), w.v.end());
      put(o + "attn.c_attn.weight", {h, 3 * h}, transposed(qkv, 3 * h, h));  // Conv1D: [in, out]
      const SplitQkv b = split_qkv(bias_or_zero(p + "attention.qkv.bias", 3 * h), nh, ng, d, 1);
      Values qkv_b = b.q;
      qkv_b.insert(qkv_b.end(), b.k.begin(), b.k.end());
      qkv_b.insert(qkv_b.end(), b.v.begin(), b.v.end());
      put(o + "attn.c_attn.bias", {3 * h}, qkv_b);
      put(o + "attn.c_proj.weight", {h, h}, transposed(get(p + "attention.proj.weight"), h, h));
      put(o + "attn.c_proj.bias", {h}, bias_or_zero(p + "attention.proj.bias", h));
      put(o + "ln_2.weight", {h}, norm(p + "mlp_norm.weight"));
      put(o + "ln_2.bias", {h}, get(p + "mlp_norm.bias"));
      put(o + "mlp.c_fc.weight", {h, D.F}, transposed(get(p + "mlp.fc1.weight"), D.F, h));
      put(o + "mlp.c_fc.bias", {D.F}, bias_or_zero(p + "mlp.fc1.bias", D.F));
      put(o + "mlp.c_proj.weight", {D.F, h}, transposed(get(p + "mlp.fc2.weight"), h, D.F));
      put(o + "mlp.c_proj.bias", {h}, bias_or_zero(p + "mlp.fc2.bias", h));
    }
    put("transformer.ln_f.weight", {h}, norm("final_norm.weight"));
    put("transformer.ln_f.bias", {h}, get("final_norm.bias"));
    if (!D.tied) put("lm_head.weight", {V, h}, get("output_layer.weight"));
    if (!D.qkv_bias) notes.push_back("note: the model has no biases (--disable-bias-linear); GPT-2's are written as zeros");
    else if (!D.bias) notes.push_back("note: the model has only QKV biases (--add-qkv-bias); GPT-2's other biases are written as zeros");
    config = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", V}, {"n_positions", D.max_pos}, {"n_ctx", D.max_pos},
              {"n_embd", h}, {"n_layer", L}, {"n_head", nh}, {"n_inner", D.F}, {"activation_function", D.gelu_erf ? "gelu" : "gelu_new"},
              {"layer_norm_epsilon", c.model.norm_epsilon}, {"resid_pdrop", c.model.hidden_dropout}, {"embd_pdrop", c.model.hidden_dropout},
              {"attn_pdrop", c.model.attention_dropout}, {"initializer_range", c.model.init_method_std}, {"scale_attn_weights", true},
              {"tie_word_embeddings", D.tied}, {"torch_dtype", dtype_name}};
  } else {
    refuse(D.learned_pos, "LLaMA / Mixtral / Qwen3 take RoPE, not learned positions");
    refuse(qwen3 && D.bias, "Qwen3's MLPs have no biases (--disable-bias-linear, with --add-qkv-bias for the attention's)");
    put("model.embed_tokens.weight", {V, h}, get("embedding.word_embeddings.weight"));
    std::vector<int64_t> dense_layers;  // (Qwen3-MoE's mlp_only_layers)
    // Multi-token prediction's modules: DeepSeek-V3's and GLM-4.5's checkpoints carry them as the layers after the decoder's
    // (model.layers.{L + k}: the transformer layer's tensors, and enorm, hnorm, eh_proj, shared_head.norm, with copies of the
    // embedding and the output layer); the other families have no place for them.
    const int64_t mtp = glm ? D.mtp : 0;
    if (D.mtp > 0 && !glm) {
      notes.push_back("note: the " + std::to_string(D.mtp) + " multi-token prediction module(s) (--mtp-num-layers) are left out: " + family +
                      "'s HF form has no place for them (DeepseekV3ForCausalLM and Glm4MoeForCausalLM do)");
    }
    for (int64_t l = 0; l < L + mtp; ++l) {
      const std::string p = l < L ? "layers." + std::to_string(l) + "." : "mtp." + std::to_string(l - L) + ".layer.";
      const std::string o = "model.layers." + std::to_string(l) + ".";
      put(o + "input_layernorm.weight", {h}, norm(p + "input_norm.weight"));
      if (deepseek) {  // (Megatron's MLA tensors are HF's as they are: the rows per head [nope | rope], [k_nope | v])
        const int64_t Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
        put(o + "self_attn.q_a_proj.weight", {Rq, h}, get(p + "attention.q_down_proj.weight"));
        put(o + "self_attn.q_a_layernorm.weight", {Rq}, norm(p + "attention.q_layernorm.weight"));
        put(o + "self_attn.q_b_proj.weight", {nh * d, Rq}, get(p + "attention.q_up_proj.weight"));
        put(o + "self_attn.kv_a_proj_with_mqa.weight", {Rkv + D.qk_rope, h}, get(p + "attention.kv_down_proj.weight"));
        put(o + "self_attn.kv_a_layernorm.weight", {Rkv}, norm(p + "attention.kv_layernorm.weight"));
        put(o + "self_attn.kv_b_proj.weight", {nh * (D.qk_nope + D.v_dim), Rkv}, get(p + "attention.kv_up_proj.weight"));
        put(o + "self_attn.o_proj.weight", {h, nh * D.v_dim}, get(p + "attention.proj.weight"));
      }
      if (!deepseek) {
      SplitQkv w = split_qkv(get(p + "attention.qkv.weight"), nh, ng, d, h);
      if (D.rotary_interleaved) {
        w.q = deinterleave_heads(w.q, nh, d, h);
        w.k = deinterleave_heads(w.k, ng, d, h);
      }
      put(o + "self_attn.q_proj.weight", {nh * d, h}, w.q);
      put(o + "self_attn.k_proj.weight", {ng * d, h}, w.k);
      put(o + "self_attn.v_proj.weight", {ng * d, h}, w.v);
      if (D.qkv_bias) {  // (--add-qkv-bias alone: HF's attention_bias with o_proj's bias zeros, the same model)
        SplitQkv b = split_qkv(get(p + "attention.qkv.bias"), nh, ng, d, 1);
        if (D.rotary_interleaved) {
          b.q = deinterleave_heads(b.q, nh, d, 1);
          b.k = deinterleave_heads(b.k, ng, d, 1);
        }
        put(o + "self_attn.q_proj.bias", {nh * d}, b.q);
        put(o + "self_attn.k_proj.bias", {ng * d}, b.k);
        put(o + "self_attn.v_proj.bias", {ng * d}, b.v);
        // (Qwen2-MoE's and GLM-4.5's o_proj have no bias)
        if (family != "qwen2_moe" && !glm) {
          put(o + "self_attn.o_proj.bias", {h}, D.bias ? get(p + "attention.proj.bias") : Values(static_cast<size_t>(h), 0.0f));
        }
      }
      put(o + "self_attn.o_proj.weight", {h, nh * d}, get(p + "attention.proj.weight"));
      if (family == "gpt_oss") {
        put(o + "self_attn.sinks", {nh}, get(p + "attention.softmax_offset"));
        out.back().fp32 = true;  // (HF keeps the sinks in fp32 as they are: a logit beside every row's scores)
      }
      if (qwen3 || (glm && !deepseek && D.qk_norm)) {  // one [d] weight shared by the heads, in HF's rotate-half order of the head dimension
        Values qn = norm(p + "attention.q_norm.weight"), kn = norm(p + "attention.k_norm.weight");
        if (D.rotary_interleaved) {
          qn = deinterleave_heads(qn, 1, d, 1);
          kn = deinterleave_heads(kn, 1, d, 1);
        }
        put(o + "self_attn.q_norm.weight", {d}, qn);
        put(o + "self_attn.k_norm.weight", {d}, kn);
      }
      }
      put(o + "post_attention_layernorm.weight", {h}, norm(p + "mlp_norm.weight"));
      if (!moe[static_cast<size_t>(std::min(l, L - 1))] || D.experts == 0) {  // (a module's layer: the last layer's kind)
        refuse(family == "mixtral", "MixtralForCausalLM has an MoE MLP in every layer (--moe-layer-freq must be 1)");
        if ((family == "qwen3_moe" || family == "qwen2_moe" || glm) && l < L) dense_layers.push_back(l);
        put(o + "mlp.gate_proj.weight", {D.F, h}, get(p + "mlp.fc1_gate.weight"));
        put(o + "mlp.up_proj.weight", {D.F, h}, get(p + "mlp.fc1_up.weight"));
        put(o + "mlp.down_proj.weight", {h, D.F}, get(p + "mlp.fc2.weight"));
        if (D.bias) {
          put(o + "mlp.gate_proj.bias", {D.F}, get(p + "mlp.fc1_gate.bias"));
          put(o + "mlp.up_proj.bias", {D.F}, get(p + "mlp.fc1_up.bias"));
          put(o + "mlp.down_proj.bias", {h}, get(p + "mlp.fc2.bias"));
        }
        continue;
      }
      if (family == "gpt_oss") {  // the experts stacked, [in, out] each, gate and up interleaved in gate_up_proj's columns
        put(o + "mlp.router.weight", {D.experts, h}, get(p + "mlp.router.weight"));
        put(o + "mlp.router.bias", {D.experts}, get(p + "mlp.router.bias"));
        const int64_t F = D.F_moe, E = D.experts;
        Values gate_up(static_cast<size_t>(E * h * 2 * F)), gate_up_b(static_cast<size_t>(E * 2 * F)), down, down_b;
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          const Values gate = get(x + "fc1_gate.weight"), up = get(x + "fc1_up.weight"), gb = get(x + "fc1_gate.bias"), ub = get(x + "fc1_up.bias");
          for (int64_t j = 0; j < F; ++j) {
            for (int64_t i = 0; i < h; ++i) {
              gate_up[static_cast<size_t>((e * h + i) * 2 * F + 2 * j)] = gate[static_cast<size_t>(j * h + i)];
              gate_up[static_cast<size_t>((e * h + i) * 2 * F + 2 * j + 1)] = up[static_cast<size_t>(j * h + i)];
            }
            gate_up_b[static_cast<size_t>(e * 2 * F + 2 * j)] = gb[static_cast<size_t>(j)];
            gate_up_b[static_cast<size_t>(e * 2 * F + 2 * j + 1)] = ub[static_cast<size_t>(j)];
          }
          const Values d_t = transposed(get(x + "fc2.weight"), h, F);  // [F, h]
          down.insert(down.end(), d_t.begin(), d_t.end());
          const Values db = get(x + "fc2.bias");
          down_b.insert(down_b.end(), db.begin(), db.end());
        }
        put(o + "mlp.experts.gate_up_proj", {E, h, 2 * F}, std::move(gate_up));
        put(o + "mlp.experts.gate_up_proj_bias", {E, 2 * F}, std::move(gate_up_b));
        put(o + "mlp.experts.down_proj", {E, F, h}, std::move(down));
        put(o + "mlp.experts.down_proj_bias", {E, h}, std::move(down_b));
        continue;
      }
      const HfMoeNames hn = hf_moe_names(family == "qwen3_moe" || family == "qwen2_moe" || glm);
      put(o + hn.block + "gate.weight", {D.experts, h}, get(p + "mlp.router.weight"));
      for (int64_t e = 0; e < D.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".", y = o + hn.block + "experts." + std::to_string(e) + ".";
        put(y + hn.gate + ".weight", {D.F_moe, h}, get(x + "fc1_gate.weight"));
        put(y + hn.up + ".weight", {D.F_moe, h}, get(x + "fc1_up.weight"));
        put(y + hn.down + ".weight", {h, D.F_moe}, get(x + "fc2.weight"));
      }
      if (glm) {  // the bias of the choice (zeros without --moe-router-enable-expert-bias), the ungated shared experts
        put(o + "mlp.gate.e_score_correction_bias", {D.experts},
            has(p + "mlp.router.expert_bias") ? get(p + "mlp.router.expert_bias") : Values(static_cast<size_t>(D.experts), 0.0f));
        out.back().fp32 = true;  // (it decides the choice: HF keeps it in fp32, as Megatron does)
      }
      if (family == "qwen2_moe" || (glm && D.F_shared > 0)) {  // the shared expert (Qwen2-MoE's with its gate; GLM-4.5's ungated)
        const std::string x = p + "mlp.shared_experts.", y = o + (glm ? "mlp.shared_experts." : "mlp.shared_expert.");
        put(y + "gate_proj.weight", {D.F_shared, h}, get(x + "fc1_gate.weight"));
        put(y + "up_proj.weight", {D.F_shared, h}, get(x + "fc1_up.weight"));
        put(y + "down_proj.weight", {h, D.F_shared}, get(x + "fc2.weight"));
        if (!glm) put(o + "mlp.shared_expert_gate.weight", {1, h}, get(x + "gate.weight"));
      }
    }
    put("model.norm.weight", {h}, norm("final_norm.weight"));
    if (!D.tied) put("lm_head.weight", {V, h}, get("output_layer.weight"));
    for (int64_t k = 0; k < mtp; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".", o = "model.layers." + std::to_string(L + k) + ".";
      put(o + "enorm.weight", {h}, norm(p + "enorm.weight"));
      put(o + "hnorm.weight", {h}, norm(p + "hnorm.weight"));
      put(o + "eh_proj.weight", {h, 2 * h}, get(p + "eh_proj.weight"));
      put(o + "shared_head.norm.weight", {h}, norm(p + "final_norm.weight"));
      put(o + "shared_head.head.weight", {V, h}, get(D.tied ? "embedding.word_embeddings.weight" : "output_layer.weight"));
      put(o + "embed_tokens.weight", {V, h}, get("embedding.word_embeddings.weight"));
    }
    const std::string arch = family == "mixtral" ? "MixtralForCausalLM"
                             : family == "gpt_oss" ? "GptOssForCausalLM"
                             : family == "qwen3"   ? "Qwen3ForCausalLM"
                             : family == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                             : family == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                             : glm                   ? moe_arch
                             : windowed              ? "MistralForCausalLM"
                                                     : "LlamaForCausalLM";
    config = {{"architectures", {arch}}, {"model_type", arch == "MistralForCausalLM" ? "mistral" : family},
              {"vocab_size", V}, {"hidden_size", h}, {"intermediate_size", family == "mixtral" || family == "gpt_oss" ? D.F_moe : D.F}, {"num_hidden_layers", L},
              {"num_attention_heads", nh}, {"num_key_value_heads", ng}, {"head_dim", d}, {"hidden_act", "silu"},
              {"max_position_embeddings", D.max_pos}, {"rms_norm_eps", c.model.norm_epsilon}, {"rope_theta", c.model.rotary_base},
              {"attention_dropout", c.model.attention_dropout}, {"initializer_range", c.model.init_method_std},
              {"tie_word_embeddings", D.tied}, {"torch_dtype", dtype_name}};
    if (glm) config["num_nextn_predict_layers"] = mtp;  // (the multi-token prediction layers after the decoder's)
    const auto interpolation = c.model.rotary_seq_len_interpolation_factor;
    refuse(c.model.use_rope_scaling && interpolation.has_value(),
           "--use-rope-scaling with --rotary-seq-len-interpolation-factor: HF's rope_scaling holds one rope type (llama3 or linear)");
    if (c.model.use_rope_scaling) {  // LLaMA 3.1's (Megatron's fixed low / high factors and original length)
      const RopeScaling r{.factor = c.model.rope_scaling_factor};
      config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", r.factor}, {"low_freq_factor", r.low_freq_factor},
                                {"high_freq_factor", r.high_freq_factor}, {"original_max_position_embeddings", static_cast<int64_t>(r.original_max_positions)}};
    } else if (interpolation) {  // (HF's linear rope type: the positions divided by the factor, as Megatron's)
      config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", static_cast<double>(*interpolation)}};
    } else if (c.model.position_embedding_type == "yarn" ||
               (deepseek && c.model.rope_type.value_or("yarn") == "yarn" && c.model.rotary_scaling_factor != 1.0)) {
      // (MLA's YaRN at factor 1 is plain RoPE with no attention factor: written without rope_scaling, which some
      // transformers versions would otherwise give a factor of max_position_embeddings / original_max_position_embeddings)
      // (HF's yarn rope type: its attention factor from mscale as Megatron's; MLA's RoPE is YaRN's unless --rope-type rope)
      const RopeScaling y = yarn_scaling(c.model);
      config["rope_scaling"] = {{"rope_type", "yarn"},
                                {"factor", y.yarn_factor},
                                {"original_max_position_embeddings", static_cast<int64_t>(y.yarn_original_max_positions)},
                                {"beta_fast", y.yarn_beta_fast},
                                {"beta_slow", y.yarn_beta_slow},
                                {"truncate", y.yarn_round_to_int}};
      // (Some transformers versions take YaRN's factor as max_position_embeddings / original_max_position_embeddings
      // where the latter is given: written so that the two agree, where the factor times the original length is whole)
      const double extended = y.yarn_factor * y.yarn_original_max_positions;
      if (extended == std::floor(extended) && extended >= static_cast<double>(D.max_pos)) {
        config["max_position_embeddings"] = static_cast<int64_t>(extended);
      } else {
        notes.push_back("note: max_position_embeddings " + std::to_string(D.max_pos) + " is not --rotary-scaling-factor x "
                        "--yarn-original-max-position-embeddings: transformers versions that derive YaRN's factor from the two build "
                        "another model (current ones take the factor as written)");
      }
      if (y.yarn_mscale_all_dim != 0.0) {  // (HF's mscale / mscale_all_dim ratio, taken only when both are nonzero)
        refuse(y.yarn_mscale == 0.0, "--mscale 0 with --mscale-all-dim: HF reads the ratio only when both are nonzero");
        config["rope_scaling"]["mscale"] = y.yarn_mscale;
        config["rope_scaling"]["mscale_all_dim"] = y.yarn_mscale_all_dim;
      } else if (y.yarn_mscale != 1.0) {
        config["rope_scaling"]["attention_factor"] = rope_attention_factor(y);
      }
    } else if (family == "gpt_oss") {  // (GptOssConfig defaults to YaRN: plain RoPE said so)
      config["rope_scaling"] = {{"rope_type", "default"}};
    }
    if (family == "gpt_oss") {
      const MoeConfig& mc = c.moe;
      config["attention_bias"] = true;
      config["num_local_experts"] = D.experts;
      config["num_experts_per_tok"] = D.topk;
      config["swiglu_alpha"] = static_cast<double>(kQuickGeluAlpha);
      config["swiglu_limit"] = static_cast<double>(D.glu.clamp);
      config["router_aux_loss_coef"] = router_aux_loss_coef(mc);
      config["output_router_logits"] = false;
      config["sliding_window"] = windowed ? nlohmann::ordered_json(window_left + 1) : nlohmann::ordered_json(nullptr);
      nlohmann::ordered_json types = nlohmann::ordered_json::array();
      for (int64_t l = 0; l < L; ++l) types.push_back(D.windows.empty() || D.windows[static_cast<size_t>(l)] < 0 ? "full_attention" : "sliding_attention");
      config["layer_types"] = types;
    }
    if (family == "llama" && windowed) {
      config["sliding_window"] = window_left + 1;
    } else if (family == "llama") {
      config["attention_bias"] = D.qkv_bias;
      config["mlp_bias"] = D.bias;
    } else if (family == "qwen2_moe") {  // (QKV biases always, no other: refused above otherwise)
      config["qkv_bias"] = true;
      config["use_sliding_window"] = false;
      config["sliding_window"] = nullptr;
      config["max_window_layers"] = L;
    } else if (qwen3) {
      config["attention_bias"] = D.qkv_bias;  // (its o_proj's bias too, written as zeros above)
      config["use_sliding_window"] = windowed;
      config["sliding_window"] = windowed ? nlohmann::ordered_json(window_left + 1) : nlohmann::ordered_json(nullptr);
      // (Qwen3's windowed layers: from max_window_layers on where they are the last ones, and named in layer_types, which
      // newer transformers read; Qwen3-MoE windows every layer)
      int64_t first_windowed = L;
      while (windowed && first_windowed > 0 && D.windows[static_cast<size_t>(first_windowed - 1)] >= 0) --first_windowed;
      const bool suffix = windowed && std::none_of(D.windows.begin(), D.windows.begin() + first_windowed, [](int64_t w) { return w >= 0; });
      config["max_window_layers"] = suffix ? first_windowed : L;
      if (windowed && family == "qwen3") {
        nlohmann::ordered_json types = nlohmann::ordered_json::array();
        for (int64_t l = 0; l < L; ++l) types.push_back(D.windows[static_cast<size_t>(l)] >= 0 ? "sliding_attention" : "full_attention");
        config["layer_types"] = types;
      }
    }
    if (deepseek) {  // (DeepseekV3Config: head_dim is its RoPE width; the latents' norms and rope_interleave as Megatron's MLA)
      config["head_dim"] = D.qk_rope;
      config["q_lora_rank"] = D.q_lora_rank;
      config["kv_lora_rank"] = D.kv_lora_rank;
      config["qk_nope_head_dim"] = D.qk_nope;
      config["qk_rope_head_dim"] = D.qk_rope;
      config["v_head_dim"] = D.v_dim;
      config["rope_interleave"] = true;
      config["attention_bias"] = false;
    }
    if (glm) {
      const MoeConfig& mc = c.moe;
      if (!deepseek) {
        config["attention_bias"] = D.qkv_bias;
        config["use_qk_norm"] = D.qk_norm;
        // (HF rotates int(head_dim x factor) channels: the factor nudged up until that is exactly the rotary dimension)
        double factor = static_cast<double>(D.rot_dim) / static_cast<double>(d);
        while (static_cast<int64_t>(static_cast<double>(d) * factor) < D.rot_dim) factor = std::nextafter(factor, 2.0);
        config["partial_rotary_factor"] = factor;
      } else {  // (the original checkpoints' remote code reads these)
        config["scoring_func"] = "sigmoid";
        config["topk_method"] = "noaux_tc";
      }
      config["moe_intermediate_size"] = D.F_moe;
      config["n_routed_experts"] = D.experts;
      config["num_experts_per_tok"] = D.topk;
      config["n_shared_experts"] = D.F_moe > 0 ? D.F_shared / D.F_moe : 0;
      config["routed_scaling_factor"] = mc.moe_router_topk_scaling_factor.value_or(1.0);
      // (groups that mask nothing, every group kept, as HF's one group)
      const bool masking = mc.moe_router_num_groups.value_or(1) > mc.moe_router_group_topk.value_or(1);
      config["n_group"] = masking ? mc.moe_router_num_groups.value_or(1) : 1;
      config["topk_group"] = masking ? mc.moe_router_group_topk.value_or(1) : 1;
      config["first_k_dense_replace"] = static_cast<int64_t>(dense_layers.size());
      config["norm_topk_prob"] = D.topk > 1;  // (megatrain's sigmoid router renormalises the top k, at top-1 weighs by the score)
      if (D.F_shared == 0 && D.experts > 0) notes.push_back("note: n_shared_experts 0: " + moe_arch + " builds shared experts 0 wide (nothing added)");
      if (masking && mc.moe_router_enable_expert_bias) {
        notes.push_back("note: HF's " + moe_arch + " masks the experts of the groups not chosen with 0 where Megatron masks them with -inf: the "
                        "two choose alike while every chosen group's biased scores (sigmoid + e_score_correction_bias) are positive");
      }
    }
    if (family == "qwen3_moe" || family == "qwen2_moe") {
      const MoeConfig& mc = c.moe;
      // Qwen3-MoE's router: a softmax over every expert, the top k, renormalised over them with norm_topk_prob (Megatron's
      // softmax over the top-k logits, the same values) or not (--moe-router-pre-softmax).
      refuse(mc.moe_router_score_function != "softmax" || mc.moe_router_topk_scaling_factor.has_value() || mc.moe_router_num_groups.has_value() ||
                 mc.moe_router_enable_expert_bias || mc.load_balancing_is("quantile_balancing"),
             "Qwen3-MoE's router is a softmax with the top k, renormalised or not: no sigmoid scores, scaling factor, groups, expert bias "
             "or quantile balancing's bias");
      refuse(mc.moe_expert_capacity_factor.has_value(), "Qwen3-MoE is dropless (no --moe-expert-capacity-factor)");
      refuse(family == "qwen3_moe" && D.F_shared > 0, "Qwen3-MoE has no shared experts (Qwen2-MoE's, without --qk-layernorm, have)");
      if (family == "qwen2_moe") config["shared_expert_intermediate_size"] = D.F_shared;
      // (sinkhorn routing's trained model routes by the softmax over all experts, the top k not renormalised: top-1 would be sigmoid's)
      const bool sinkhorn = mc.load_balancing_is("sinkhorn");
      refuse(sinkhorn && D.topk == 1, "sinkhorn routing at --moe-router-topk 1 weighs by a sigmoid, which HF's softmax routers cannot");
      config["num_experts"] = D.experts;
      config["num_experts_per_tok"] = D.topk;
      config["moe_intermediate_size"] = D.F_moe;
      config["norm_topk_prob"] = !mc.moe_router_pre_softmax && !sinkhorn;
      config["decoder_sparse_step"] = 1;
      config["mlp_only_layers"] = dense_layers;
      config["router_aux_loss_coef"] = router_aux_loss_coef(mc);
      config["output_router_logits"] = false;
    } else if (family == "mixtral") {
      const MoeConfig& mc = c.moe;
      refuse(D.qkv_bias, "MixtralForCausalLM has no biases (--disable-bias-linear, without --add-qkv-bias)");
      refuse(mc.moe_router_score_function != "softmax" || mc.moe_router_pre_softmax || mc.moe_router_topk_scaling_factor.has_value() ||
                 mc.moe_router_num_groups.has_value() || mc.moe_router_enable_expert_bias || mc.load_balancing_is("quantile_balancing"),
             "Mixtral's router is a softmax over the top-k logits: no --moe-router-pre-softmax, sigmoid scores, scaling factor, "
             "groups, expert bias or quantile balancing's bias");
      refuse(mc.moe_expert_capacity_factor.has_value(), "Mixtral is dropless (no --moe-expert-capacity-factor)");
      refuse(mc.load_balancing_is("sinkhorn"),
             "a model trained with sinkhorn routing weighs by the softmax over all experts (or a sigmoid at top-1), not Mixtral's "
             "softmax over the top k: export it as Qwen3-MoE (--qk-layernorm), or train with another balancing type");
      refuse(D.F_shared > 0, "Mixtral has no shared experts");
      config["num_local_experts"] = D.experts;
      config["num_experts_per_tok"] = D.topk;
      config["router_aux_loss_coef"] = router_aux_loss_coef(mc);
      config["output_router_logits"] = false;
      config["sliding_window"] = windowed ? nlohmann::ordered_json(window_left + 1) : nlohmann::ordered_json(nullptr);
    }
  }
  if (V != m.info.vocab_size) {
    notes.push_back("note: vocab_size " + std::to_string(V) + " is the padded vocabulary the model was trained with (the tokenizer has " +
                    std::to_string(m.info.vocab_size) + " tokens; the rest are Megatron's padding rows)");
  }
  // The safetensors files, HF's shard names past the size limit.
  fs::create_directories(opt.out_dir);
  // An earlier export's weights would shadow or mix with these (HF reads model.safetensors before the index).
  for (const auto& entry : fs::directory_iterator(opt.out_dir)) {
    const std::string f = entry.path().filename().string();
    if (f.rfind("model", 0) == 0 && (f.size() > 12 && (f.substr(f.size() - 12) == ".safetensors" || f.find(".safetensors.index.json") != std::string::npos))) {
      fs::remove(entry.path());
    }
  }
  auto bf16_of = [&](const Exported& t) { return opt.dtype == "bf16" && !t.fp32; };
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t bytes = static_cast<int64_t>(out[i].values.size()) * (bf16_of(out[i]) ? 2 : 4);
    if (in_shard > 0 && in_shard + bytes > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }
  auto shard_name = [&](size_t k) {
    if (shards.size() == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    return std::string(buf);
  };
  nlohmann::ordered_json weight_map;
  std::vector<std::string> written;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::vector<SafeTensor> tensors;
    for (size_t i : shards[k]) {
      const bool bf16 = bf16_of(out[i]);
      SafeTensor t{out[i].name, bf16 ? "BF16" : "F32", out[i].shape, {}};
      t.bytes.resize(out[i].values.size() * (bf16 ? 2u : 4u));
      if (bf16) {
        for (size_t j = 0; j < out[i].values.size(); ++j) {
          const uint16_t b = float_to_bf16(out[i].values[j]);
          std::memcpy(t.bytes.data() + 2 * j, &b, 2);
        }
      } else {
        std::memcpy(t.bytes.data(), out[i].values.data(), t.bytes.size());
      }
      weight_map[t.name] = shard_name(k);
      tensors.push_back(std::move(t));
    }
    write_safetensors((fs::path(opt.out_dir) / shard_name(k)).string(), tensors, {{"format", "pt"}});
    written.push_back("wrote " + (fs::path(opt.out_dir) / shard_name(k)).string() + " (" + std::to_string(tensors.size()) + " tensors)");
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream idx(fs::path(opt.out_dir) / "model.safetensors.index.json");
    idx << index.dump(2) << "\n";
    idx.flush();
    if (!idx) throw DataError("cannot write " + (fs::path(opt.out_dir) / "model.safetensors.index.json").string());
    written.push_back("wrote " + (fs::path(opt.out_dir) / "model.safetensors.index.json").string());
  }
  // Tokenizer: what the run read, under HF's file names.
  nlohmann::ordered_json generation = {{"_from_model_config", true}};
  const std::string tok = c.data.tokenizer_type.value_or("");
  auto copy_file = [&](const std::optional<std::string>& from, const std::string& to) {
    if (!from) return;
    std::error_code ec;
    fs::copy_file(*from, fs::path(opt.out_dir) / to, fs::copy_options::overwrite_existing, ec);
    if (ec) notes.push_back("note: the run's tokenizer file " + *from + " could not be copied (" + ec.message() + "): copy it beside the model as " + to);
    else written.push_back("copied " + *from + " as " + to);
  };
  if (tok == "GPT2BPETokenizer") {
    copy_file(c.data.vocab_file, "vocab.json");
    copy_file(c.data.merge_file, "merges.txt");
    config["bos_token_id"] = 50256;
    config["eos_token_id"] = 50256;
    generation["bos_token_id"] = 50256;
    generation["eos_token_id"] = 50256;
  } else if (tok == "HuggingFaceTokenizer" && c.data.tokenizer_model) {
    fs::path src(*c.data.tokenizer_model);
    if (fs::is_directory(src)) {
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
        if (fs::exists(src / f)) copy_file((src / f).string(), f);
      }
    } else {
      copy_file(src.string(), "tokenizer.json");
    }
  } else if ((tok == "Llama2Tokenizer" || tok == "GPTSentencePieceTokenizer" || tok == "SentencePieceTokenizer") && c.data.tokenizer_model) {
    copy_file(c.data.tokenizer_model, "tokenizer.model");  // HF's LlamaTokenizer reads tokenizer.model
  } else {
    notes.push_back("note: no tokenizer files to copy (--tokenizer-type " + (tok.empty() ? std::string("unset") : tok) + ")");
  }
  auto write_json = [&](const std::string& file, const nlohmann::ordered_json& j) {
    const fs::path p = fs::path(opt.out_dir) / file;
    std::ofstream out(p);
    out << j.dump(2) << "\n";
    out.flush();
    if (!out) throw DataError("cannot write " + p.string() + " (disk full, or not writable?)");
  };
  write_json("config.json", config);
  write_json("generation_config.json", generation);
  written.push_back("wrote config.json (" + config["architectures"][0].get<std::string>() + ") and generation_config.json");
  written.insert(written.begin(), "exported " + m.info.dir + " (iteration " + std::to_string(m.info.iteration) + ") to " + opt.out_dir + " in " + opt.dtype);
  written.insert(written.end(), notes.begin(), notes.end());
  return written;
}

}  // namespace mt
