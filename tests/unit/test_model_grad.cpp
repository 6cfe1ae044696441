// test_model_grad.cpp: whole-model gradient checks (every parameter of a 2-layer GPT and a 2-layer
// LLaMA with GQA against central finite differences, fp32), and layout-independent initialisation.
#include <cmath>

#include "catch.h"
#include "config/layer_pattern.h"
#include "config/resolve.h"
#include "grad_check.h"
#include "tiny_models.h"
#include "kernels/cpu/rope.h"
#include "model/gpt_model.h"
#include "model/layout.h"
#include "model/model_dims.h"

using namespace mt;
using namespace mt::test;

namespace {

Config tiny(bool llama, bool qk_norm = false) { return tiny_decoder(llama, 2, 0.0, qk_norm); }

// (rel, abs: the tolerance of a parameter's sampled gradient, |analytic - numeric| <= rel |numeric| + abs; MoE layers
// take test_moe.cpp's, their BLAS rounding through the routing)
void check_config(Config c, double rel = 1e-3, double abs = 1e-7);
void check_model(bool llama, bool qk_norm = false) { check_config(tiny(llama, qk_norm)); }

void check_config(Config c, double rel, double abs) {
  GPTModel model(c, ProcessGroups::single());
  const Microbatch mb = tiny_batch();
  ParamStore& ps = model.params();
  ps.zero_grads();
  model.forward(mb, 1);
  model.backward(1.0f);
  model.take_mtp_losses();  // (the objective below takes each forward's own)
  std::vector<float> analytic(ps.grads().f32(), ps.grads().f32() + ps.numel());
  // The training objective: the lm loss and, with multi-token prediction, its modules' losses at their scale.
  auto loss = [&] {
    double total = model.forward(mb, 1);
    for (double m : model.take_mtp_losses()) total += static_cast<double>(model.dims().mtp_loss_scale) * m;
    return total;
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps.info(i);
    // Up to 24 elements spread over the parameter.
    const int64_t stride = std::max<int64_t>(1, p.numel / 24);
    double num_sq = 0, diff_sq = 0, an_sq = 0;
    for (int64_t e = 0; e < p.numel; e += stride) {
      const double n = numeric_grad(loss, ps.param(i) + e, 2e-2);
      const double a = analytic[static_cast<size_t>(p.offset + e)];
      num_sq += n * n;
      an_sq += a * a;
      diff_sq += (a - n) * (a - n);
    }
    INFO(p.name << ": |analytic - numeric| / |numeric| = " << std::sqrt(diff_sq / std::max(num_sq, 1e-30)) << ", |analytic| "
                << std::sqrt(an_sq) << ", |numeric| " << std::sqrt(num_sq));
    if (p.name.size() > 11 && p.name.compare(p.name.size() - 11, 11, "k_norm.bias") == 0) {
      // A shift shared by every key adds q.b to all of a query's scores: the softmax ignores it, so the
      // exact gradient is 0 and the finite difference is rounding noise.
      CHECK(std::sqrt(an_sq) <= 1e-6);
      CHECK(std::sqrt(num_sq) <= 1e-4);
      continue;
    }
    CHECK(std::sqrt(diff_sq) <= rel * std::sqrt(num_sq) + abs);
  }
}

}  // namespace

TEST_CASE("whole-model gradient check: 2-layer GPT (LayerNorm, GELU, learned positions, biases, tied)") {
  check_model(false);
}

TEST_CASE("whole-model gradient check: 2-layer LLaMA (RMSNorm, SwiGLU, RoPE, GQA, untied, no bias)") {
  check_model(true);
}

TEST_CASE("whole-model gradient check: --qk-layernorm (LayerNorm with biases on GPT, RMSNorm before RoPE on LLaMA)") {
  check_model(false, true);
  check_model(true, true);
}

TEST_CASE("whole-model gradient check: --squared-relu (GPT) and --rotary-interleaved (LLaMA)") {
  Config g = tiny(false);
  g.model.squared_relu = true;
  resolve(g, 1);
  check_config(g);
  Config l = tiny(true);
  l.model.rotary_interleaved = true;
  resolve(l, 1);
  check_config(l);
}

TEST_CASE("whole-model gradient check: --quick-geglu with --glu-linear-offset and --activation-func-clamp-value (GPT-OSS's MLP), YaRN") {
  Config g = tiny(false);
  g.model.quick_geglu = true;
  g.model.glu_linear_offset = 1.0;
  g.model.activation_func_clamp_value = 7.0;
  resolve(g, 1);
  const ModelDims D = model_dims(g, 0, 1);
  CHECK(D.swiglu);  // (gated: fc1 writes the gate and the linear half)
  CHECK(!D.glu.plain_swiglu());
  CHECK(D.glu.alpha == kQuickGeluAlpha);
  check_config(g);
  Config l = tiny(true);  // (and YaRN's RoPE, its attention factor scaling queries and keys)
  l.model.position_embedding_type = "yarn";
  l.model.rotary_scaling_factor = 4.0;
  l.model.yarn_original_max_position_embeddings = 4;
  resolve(l, 1);
  CHECK(model_dims(l, 0, 1).rope_scaling.yarn_factor == 4.0);
  check_config(l);
}

TEST_CASE("whole-model gradient check: --softmax-type learnable (GPT-OSS's attention sinks) and off-by-one") {
  Config g = tiny(false);
  g.model.softmax_type = "learnable";
  resolve(g, 1);
  check_config(g);  // (the sink logits among the parameters: each layer's attention.softmax_offset)
  Config l = tiny(true);
  l.model.softmax_type = "off-by-one";
  resolve(l, 1);
  check_config(l);
}

TEST_CASE("whole-model gradient check: --multi-latent-attention (DeepSeek's MLA)") {
  // LLaMA-style: the queries through a latent with its norm, YaRN's RoPE on the shared key part (its attention factor in
  // cos and sin, the softmax scale by mscale^2), value heads wider than the query / key heads (the core attention's
  // padding on the query side)
  Config l = tiny(true);
  l.model.group_query_attention = false;
  l.model.multi_latent_attention = true;
  l.model.q_lora_rank = 6;
  l.model.kv_lora_rank = 5;
  l.model.qk_head_dim = 4;
  l.model.qk_pos_emb_head_dim = 4;
  l.model.v_head_dim = 10;
  l.model.qk_layernorm = true;
  l.model.rotary_scaling_factor = 4.0;
  l.model.mscale = 0.7;
  l.model.mscale_all_dim = 1.0;
  l.model.yarn_original_max_position_embeddings = 4;
  l.model.init_method_std = 0.6;  // (gradients of the query path large enough for fp32's finite differences)
  resolve(l, 1);
  const ModelDims D = model_dims(l, 0, 1);
  CHECK(D.mla);
  CHECK(D.d == 8);
  CHECK(D.rope_scaling.yarn_factor == 4.0);
  const double mscale = 0.1 * std::log(4.0) + 1.0;
  CHECK(D.softmax_scale == Approx(mscale * mscale / std::sqrt(8.0)).epsilon(1e-6));
  check_config(l);
  // GPT-style: LayerNorm, the output projection's bias, one query projection, no latent norms, plain RoPE
  // (--rope-type rope), value heads narrower (padding on the value side), learned sinks
  Config g = tiny(false);
  g.model.position_embedding_type = "rope";
  g.model.multi_latent_attention = true;
  g.model.rope_type = "rope";
  g.model.kv_lora_rank = 6;
  g.model.qk_head_dim = 6;
  g.model.qk_pos_emb_head_dim = 2;
  g.model.v_head_dim = 3;
  g.model.softmax_type = "learnable";
  g.model.init_method_std = 0.6;
  resolve(g, 1);
  CHECK(model_dims(g, 0, 1).rope_scaling.yarn_factor == 0.0);
  check_config(g);
  // Megatron's default position embedding (learned_absolute) beside MLA's own RoPE: both positions' gradients
  Config p = tiny(false);
  REQUIRE(p.model.position_embedding_type == "learned_absolute");
  p.model.multi_latent_attention = true;
  p.model.rope_type = "rope";
  p.model.kv_lora_rank = 6;
  p.model.qk_head_dim = 6;
  p.model.qk_pos_emb_head_dim = 2;
  p.model.v_head_dim = 6;
  p.model.init_method_std = 0.6;
  resolve(p, 1);
  CHECK(model_dims(p, 0, 1).learned_pos);
  check_config(p);
  // MLA's rotation is its own: with --position-embedding-type none the model is the one with rope (the same parameters,
  // the same loss), as in Megatron, where MLA rotates whatever the model's position embedding
  auto loss = [&g](const std::string& positions) {
    Config m = g;
    m.model.softmax_type = "vanilla";
    m.model.position_embedding_type = positions;
    resolve(m, 1);
    GPTModel model(m, ProcessGroups::single());
    return model.forward(tiny_batch(), 1, false);
  };
  CHECK(loss("none") == loss("rope"));
}

TEST_CASE("--reset-position-ids: RoPE rotates by the sequence's positions, the learned position embeddings take the reset ones") {
  // (Megatron: the rotary embedding of the sequence length whatever the position ids, which only the learned embeddings read)
  auto loss = [](bool llama, bool reset) {
    Config m = tiny(llama);
    resolve(m, 1);
    Microbatch mb = tiny_batch();
    if (reset) {  // (the loader's form: positions restarting at documents, RoPE's kept as the sequence's)
      mb.rope_positions = mb.positions;
      for (size_t i = 0; i < mb.positions.size(); ++i) mb.positions[i] = static_cast<int32_t>(i % 3);
    }
    GPTModel model(m, ProcessGroups::single());
    return model.forward(mb, 1, false);
  };
  CHECK(loss(true, true) == loss(true, false));
  CHECK(loss(false, true) != loss(false, false));
}

TEST_CASE("whole-model gradient check: --mtp-num-layers (DeepSeek-V3's multi-token prediction)") {
  SECTION("LLaMA-style (GQA, RoPE, untied output layer): two modules, each's loss at 0.3 / 2") {
    Config l = tiny(true);
    l.model.mtp_num_layers = 2;
    l.model.mtp_loss_scaling_factor = 0.3;
    l.model.init_method_std = 0.3;
    resolve(l, 1);
    CHECK(model_dims(l, 0, 1).mtp_loss_scale == Approx(0.15));
    check_config(l);
  }
  SECTION("GPT-style: learned positions (shifted with the tokens), tied embeddings, LayerNorm with biases") {
    Config g = tiny(false);
    g.model.mtp_num_layers = 1;
    g.model.mtp_loss_scaling_factor = 0.5;
    g.model.init_method_std = 0.3;
    resolve(g, 1);
    check_config(g);
  }
  SECTION("MoE: the module's layer takes the last layer's kind (an MoE layer)") {
    Config m = tiny(true);
    m.model.mtp_num_layers = 1;
    m.model.mtp_loss_scaling_factor = 0.5;
    m.moe.num_experts = 4;
    m.moe.moe_router_topk = 4;
    m.moe.moe_ffn_hidden_size = 8;
    m.moe.moe_layer_freq = "[0,1]";
    m.model.init_method_std = 0.3;
    resolve(m, 1);
    check_config(m, 3e-3, 8e-5);
  }
}

TEST_CASE("whole-model gradient check: GELU's erf form (GPT without biases, as Megatron drops its bias-GELU fusion there)") {
  Config g = tiny(false);
  g.model.disable_bias_linear = true;
  resolve(g, 1);
  CHECK(model_dims(g, 0, 1).gelu_erf);
  check_config(g);
  Config b = tiny(false);  // (with biases: the fused tanh form, unless --no-bias-gelu-fusion)
  resolve(b, 1);
  CHECK(!model_dims(b, 0, 1).gelu_erf);
  b.model.no_bias_gelu_fusion = true;
  CHECK(model_dims(b, 0, 1).gelu_erf);
  Config l = tiny(true);  // (SwiGLU: no GELU)
  l.model.no_bias_gelu_fusion = true;
  resolve(l, 1);
  CHECK(!model_dims(l, 0, 1).gelu_erf);
}

TEST_CASE("--rotary-interleaved: the rotate-half rotation on interleaved channel pairs") {
  const int64_t T = 3, H = 2, d = 8, half = d / 2;
  const std::vector<int32_t> pos = {0, 5, 11};
  std::vector<float> x(static_cast<size_t>(T * H * d));
  fill_normal(x, 9);
  // Channel 2i of the interleaved layout is channel i of the halves layout, 2i + 1 is i + d / 2.
  std::vector<float> halves(x.size());
  for (int64_t r = 0; r < T * H; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      halves[static_cast<size_t>(r * d + i)] = x[static_cast<size_t>(r * d + 2 * i)];
      halves[static_cast<size_t>(r * d + i + half)] = x[static_cast<size_t>(r * d + 2 * i + 1)];
    }
  }
  cpu::rope_forward(x.data(), pos.data(), T, H, d, d, 10000.0f, true);
  cpu::rope_forward(halves.data(), pos.data(), T, H, d, d, 10000.0f, false);
  for (int64_t r = 0; r < T * H; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      CHECK(x[static_cast<size_t>(r * d + 2 * i)] == halves[static_cast<size_t>(r * d + i)]);
      CHECK(x[static_cast<size_t>(r * d + 2 * i + 1)] == halves[static_cast<size_t>(r * d + i + half)]);
    }
  }
  cpu::rope_backward(x.data(), pos.data(), T, H, d, d, 10000.0f, true);  // the inverse rotation
  std::vector<float> again(x.size());
  fill_normal(again, 9);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(x[i] - again[i])));
  CHECK(worst < 1e-5);
}

TEST_CASE("initialisation: Megatron's scheme, and a shard holds its slice of the full model") {
  Config c = tiny(false);
  c.model.init_method_std = 0.02;
  GPTModel a(c, ProcessGroups::single());
  const ParamStore& ps = a.params();
  const size_t fc2 = ps.index_of("layers.1.mlp.fc2.weight");
  const size_t ln = ps.index_of("layers.0.input_norm.weight");
  const size_t bias = ps.index_of("layers.0.attention.qkv.bias");
  CHECK(ps.param(ln)[0] == 1.0f);
  CHECK(ps.param(bias)[3] == 0.0f);
  CHECK_FALSE(ps.info(ln).weight_decay);
  CHECK(ps.info(fc2).weight_decay);
  double sq = 0;
  for (int64_t e = 0; e < ps.info(fc2).numel; ++e) sq += std::pow(ps.param(fc2)[e], 2);
  const double std_fc2 = std::sqrt(sq / static_cast<double>(ps.info(fc2).numel));
  CHECK(std_fc2 == Approx(0.02 / std::sqrt(4.0)).epsilon(0.25));  // output layers: std / sqrt(2L)
  // A TP shard's local element maps to the global element it would be in the full tensor.
  ParamStore shard;
  ParamInfo p;
  p.name = "layers.1.mlp.fc2.weight";
  p.global_shape = ps.info(fc2).global_shape;  // [h, F], row-parallel: split on dim 1
  p.local_shape = {p.global_shape[0], p.global_shape[1] / 2};
  p.shard_dim = 1;
  p.shard_rank = 1;
  p.shard_count = 2;
  p.init_std = ps.info(fc2).init_std;
  shard.add(p);
  shard.allocate();
  shard.initialize(static_cast<uint64_t>(c.training.seed));
  const int64_t F = p.global_shape[1];
  for (int64_t r = 0; r < p.global_shape[0]; ++r) {
    for (int64_t j = 0; j < F / 2; ++j) CHECK(shard.param(0)[r * (F / 2) + j] == ps.param(fc2)[r * F + F / 2 + j]);
  }
}

TEST_CASE("whole-model gradient check: --add-qkv-bias (LLaMA without the other biases, Qwen's)") {
  Config l = tiny(true);
  REQUIRE(l.model.disable_bias_linear);
  l.model.add_qkv_bias = true;
  resolve(l, 1);
  ParamStore store;
  build_model_layout(l, {}, store);
  CHECK_NOTHROW(store.index_of("layers.0.attention.qkv.bias"));
  CHECK_THROWS(store.index_of("layers.0.attention.proj.bias"));
  CHECK_THROWS(store.index_of("layers.0.mlp.fc2.bias"));
  check_config(l);
}

TEST_CASE("--no-rope-freq: Megatron's patterns, layers without RoPE, and the gradients through them") {
  // The patterns as Megatron's no_rope_freq reads them: N is [0] * (N - 1) + [1] repeated (N dividing the layers).
  auto pattern = [](const std::string& text) {
    Config c = tiny(true);
    c.model.num_layers = 8;
    c.model.no_rope_freq = text;
    return rope_skipped_layers(c);
  };
  const std::vector<bool> every_fourth = {false, false, false, true, false, false, false, true};
  CHECK(pattern("4") == every_fourth);
  CHECK(pattern("([0]*3+[1]*1)*2") == every_fourth);
  CHECK(pattern("1") == std::vector<bool>(8, true));
  CHECK(pattern("0").empty());  // (off, as Megatron's falsy 0)
  for (const std::string bad : {"3", "[0,1]", "[0]*7+[2]", "-1", "[0]*8+"}) {
    INFO(bad);
    CHECK_THROWS_WITH(pattern(bad), MT_CONTAINS("--no-rope-freq"));
  }
  // Every layer without RoPE is the model without position embeddings (the same parameters); one layer without it is
  // neither that nor the plain model.
  auto loss = [](const std::string& skipped, const std::string& positions) {
    Config m = tiny(true);
    if (!skipped.empty()) m.model.no_rope_freq = skipped;
    m.model.position_embedding_type = positions;
    resolve(m, 1);
    GPTModel model(m, ProcessGroups::single());
    return model.forward(tiny_batch(), 1, false);
  };
  const std::string rope = "rope";
  const double none = loss("", "none"), all_skipped = loss("[1,1]", rope), first_skipped = loss("[1,0]", rope), plain = loss("", rope);
  CHECK(all_skipped == none);
  CHECK(first_skipped != none);
  CHECK(first_skipped != plain);
  CHECK(loss("[0,0]", rope) == plain);
  // The gradients with RoPE in the second layer only.
  Config g = tiny(true);
  g.model.no_rope_freq = "[1,0]";
  resolve(g, 1);
  check_config(g);
}
