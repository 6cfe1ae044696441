// test_mtp.cpp: multi-token prediction's configuration (Megatron's flags and what megatrain leaves out, refused by name),
// the shifted microbatch by hand, its FLOPs and parameter counts (Megatron's formulas), and its logged losses. Its
// arithmetic: test_model_grad.cpp's gradient checks and the parity layouts (tests/CMakeLists.txt's mtp_*).
#include <cmath>
#include <string>
#include <utility>

#include "catch.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "model/cpu/units.h"
#include "model/gpt_model.h"
#include "plan/flops.h"
#include "plan/param_count.h"
#include "tensor/device_info.h"
#include "train/capabilities.h"
#include "train/trainer.h"

using namespace mt;

namespace {

Config tiny_mtp(int64_t layers) {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = 16;
  c.model.position_embedding_type = "rope";
  c.model.normalization = "RMSNorm";
  c.model.swiglu = true;
  c.model.ffn_hidden_size = 48;
  c.model.untie_embeddings_and_output_weights = true;
  c.model.disable_bias_linear = true;
  c.model.vocab_size = 64;
  c.model.make_vocab_size_divisible_by = 32;
  c.model.mtp_num_layers = layers;
  c.model.hidden_dropout = 0;
  c.model.attention_dropout = 0;
  c.data.seq_length = 16;
  c.data.mock_data = true;
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 4;
  c.training.train_iters = 3;
  c.training.lr = 1e-3;
  c.logging.eval_iters = 0;
  return c;
}

std::string errors(Config c, int64_t world = 1) {
  std::string out;
  for (const auto& e : validate(c, world, Purpose::kTrain).errors) out += e + "\n";
  return out;
}

}  // namespace

TEST_CASE("--mtp-num-layers: Megatron's rules, and what is refused by name") {
  CHECK(errors(tiny_mtp(1)).empty());
  CHECK_THAT(errors(tiny_mtp(0)), MT_CONTAINS("--mtp-num-layers must be positive"));
  Config c = tiny_mtp(1);
  c.model.mtp_loss_scaling_factor = -0.1;
  CHECK_THAT(errors(c), MT_CONTAINS("--mtp-loss-scaling-factor must not be negative"));
  std::string gaps;
  auto gaps_of = [&](Config x, int64_t world) {
    resolve(x, world, 64);
    std::string out;
    for (const auto& g : unsupported_features(x, world, false)) out += g + "\n";
    return out;
  };
  c = tiny_mtp(1);
  c.parallel.pipeline_model_parallel_size = 2;
  CHECK(gaps_of(c, 2).empty());  // (the modules on the last stage, with its copy of the word embeddings)
  c.model.position_embedding_type = "learned_absolute";
  CHECK_THAT(gaps_of(c, 2), MT_CONTAINS("--mtp-num-layers with learned absolute positions and pipeline parallelism is not implemented"));
  // Megatron's explicit layout: one m per module, after every t, all in one stage, here the loss's
  c = tiny_mtp(2);
  c.parallel.pipeline_model_parallel_size = 2;
  for (const char* fits : {"Et|tmmL", "Et|t|t|mmL", "E|ttmmL"}) {
    c.model.num_layers = std::string(fits) == "Et|t|t|mmL" ? 3 : 2;
    c.parallel.pipeline_model_parallel_layout = fits;
    INFO(fits);
    CHECK(errors(c, 2).empty());
  }
  c.model.num_layers = 2;
  const std::pair<const char*, const char*> refused[] = {
      {"Et|tmL", "it holds 1 multi-token prediction layers (m), --mtp-num-layers is 2"},
      {"Et|tL", "it holds 0 multi-token prediction layers (m), --mtp-num-layers is 2"},
      {"Emt|mtL", "the multi-token prediction layers (m) must come after every transformer layer (t)"},
      {"Ettm|mL", "the multi-token prediction layers (m) must all be in one stage"},
      {"Etmm|tL", "must come after every transformer layer"},
      {"Et|t|tmm|L", "in a stage before the loss's (Megatron's standalone MTP stage) are not implemented"},
  };
  for (const auto& [layout, message] : refused) {
    c.model.num_layers = std::string(layout) == "Et|t|tmm|L" ? 3 : 2;
    c.parallel.pipeline_model_parallel_layout = layout;
    INFO(layout);
    CHECK_THAT(errors(c, 2), MT_CONTAINS(message));
  }
  c = tiny_mtp(1);
  c.parallel.context_parallel_size = 2;
  CHECK(gaps_of(c, 2).empty());  // (the engine shifts the whole sequences, then slices them)
  c = tiny_mtp(1);
  c.precision.bf16 = true;
  c.precision.fp8_format = "hybrid";
  CHECK_THAT(gaps_of(c, 1), MT_CONTAINS("--mtp-num-layers with FP8 is not implemented"));
  CHECK(gaps_of(tiny_mtp(2), 1).empty());
  c = tiny_mtp(1);
  c.model.window_size = "4,0";
  c.model.window_attn_skip_freq = "2";
  CHECK_THAT(gaps_of(c, 1), MT_CONTAINS("--mtp-num-layers with --window-attn-skip-freq or --no-rope-freq"));
  // The CUDA engine: refused by name (a build without CUDA says so instead)
  c = tiny_mtp(1);
  resolve(c, 1, 64);
  gaps.clear();
  for (const auto& g : cuda_engine_gaps(c, 1)) gaps += g + "\n";
  CHECK_THAT(gaps, MT_CONTAINS(built_with_cuda() ? "--mtp-num-layers (multi-token prediction) is implemented on the CPU engine only"
                                                 : "this build has no CUDA backend"));
}

TEST_CASE("--mtp-num-layers: module k's microbatch, every sample moved k places left (Megatron's roll_tensor, zeros rolled in)") {
  Microbatch mb;
  mb.B = 2;
  mb.S = 4;
  mb.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  mb.labels = {2, 3, 4, 9, 6, 7, 8, 9};
  mb.positions = {0, 1, 2, 3, 0, 1, 2, 3};
  mb.loss_mask = {1, 1, 0, 1, 1, 1, 1, 1};
  const Microbatch one = cpu::mtp_shifted(mb, 1), two = cpu::mtp_shifted(mb, 2);
  CHECK(one.tokens == std::vector<int32_t>{2, 3, 4, 0, 6, 7, 8, 0});
  CHECK(one.labels == std::vector<int32_t>{3, 4, 9, 0, 7, 8, 9, 0});
  CHECK(one.positions == std::vector<int32_t>{1, 2, 3, 0, 1, 2, 3, 0});
  CHECK(one.loss_mask == std::vector<float>{1, 0, 1, 0, 1, 1, 1, 0});
  CHECK(two.tokens == std::vector<int32_t>{3, 4, 0, 0, 7, 8, 0, 0});
  CHECK(two.labels == std::vector<int32_t>{4, 9, 0, 0, 8, 9, 0, 0});
  CHECK(two.loss_mask == std::vector<float>{0, 1, 0, 0, 1, 1, 0, 0});
  CHECK(cpu::mtp_shifted(mb, 5).tokens == std::vector<int32_t>(8, 0));  // (beyond the sequence: everything rolled in)
}

TEST_CASE("--mtp-num-layers: Megatron's FLOPs and the parameters") {
  Config plain = tiny_mtp(1), with = tiny_mtp(2);
  plain.model.mtp_num_layers.reset();
  resolve(plain, 1, 64);
  resolve(with, 1, 64);
  const double h = 32, V = 64, T = 10, s = 16, n = 4, d = 8;
  // Per module: one more layer (its MLP, attention projections and core attention), 6 (3h + 2h^2), and its logits.
  const double layer = 6.0 * h * 3.0 * 48 + 6.0 * (h * (n * d + 2.0 * n * d) + n * d * h);
  const double extra = 2.0 * (T * (layer + 6.0 * (3.0 * h + 2.0 * h * h) + 6.0 * h * V) + T * s * 6.0 * n * d);
  CHECK(flops_for_tokens(with, T) - flops_for_tokens(plain, T) == Approx(extra).epsilon(1e-12));
  // Parameters: per module three norms [h], the projection [h, 2h] and a dense layer (the last layer's kind)
  const ParamCounts a = count_params(plain), b = count_params(with);
  CHECK(b.mtp_layers == 2);
  CHECK(b.total - a.total == 2 * (3 * 32 + 2 * 32 * 32 + a.dense_layer));
  // With MoE layers (the last one MoE): the modules' layers are MoE layers
  Config moe = tiny_mtp(1);
  moe.moe.num_experts = 4;
  moe.moe.moe_router_topk = 2;
  moe.moe.moe_layer_freq = "[0,1]";
  resolve(moe, 1, 64);
  const ParamCounts m = count_params(moe);
  CHECK(m.total == m.embedding + m.output + m.final_norm + m.dense_layer + m.moe_layer + m.mtp_module + m.moe_layer);
}

TEST_CASE("--mtp-num-layers: a module's MoE router takes the expert bias's update (Megatron's: every router with one)") {
  Config c = tiny_mtp(1);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_router_score_function = "sigmoid";
  c.moe.moe_router_enable_expert_bias = true;
  c.moe.moe_layer_freq = "[0,1]";
  resolve(c, 1, 64);
  const TrainResult r = train(c, ProcessGroups::single(), {true, 0});
  for (const std::string name : {"layers.1.mlp.router.expert_bias", "mtp.0.layer.mlp.router.expert_bias"}) {
    const ParamStore& ps = r.model->params();
    const float* bias = ps.param(ps.index_of(name));
    double moved = 0;
    for (int64_t e = 0; e < 4; ++e) moved += std::fabs(bias[e]);
    INFO(name);
    CHECK(moved > 0);  // (3 updates of +-1e-3 each: sign(mean - count) is 0 only at a perfect balance)
  }
}

TEST_CASE("--mtp-num-layers: the modules' losses logged as Megatron's mtp_k loss") {
  Config c = tiny_mtp(2);
  resolve(c, 1, 64);
  const TrainResult r = train(c, ProcessGroups::single(), {true, 0});
  REQUIRE(r.moe_losses.names == std::vector<std::string>{"mtp_1 loss", "mtp_2 loss"});
  REQUIRE(r.moe_losses.size() == 3);
  // At the start every module predicts about uniformly over the 64 tokens, as the lm loss does
  for (size_t j = 0; j < 2; ++j) CHECK(std::fabs(r.moe_losses.at(0, j) - std::log(64.0)) < 0.3);
  CHECK(std::fabs(r.losses[0] - std::log(64.0)) < 0.3);
}
