// test_upcycling.cpp: --moe-use-upcycling's load (checkpoint/upcycle.h) on one rank: the experts are the dense MLP's
// slices scaled by Megatron's weight scale, the router's rows repeated by the granularity, what both models share
// loaded as saved, the shared expert left at its initial values; at granularity 1 the upcycled model computes the
// dense model's loss; and the refusals (an MoE checkpoint, another model, a --save already used).
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "catch.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/upcycle.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "model/gpt_model.h"
#include "tiny_models.h"

using namespace mt;
using namespace mt::test;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("megatrain_upcycle_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  static inline int counter = 0;
  TempDir() { fs::remove_all(path); }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

// The dense model's checkpoint (weights only, iteration 8 after 64 samples).
void save_dense(const Config& c, GPTModel& model, const std::string& dir) {
  Optimizer optim(c, model.params(), ProcessGroups::single());
  TrainState state;
  state.iteration = 8;
  state.consumed_samples = 64;
  CheckpointRank who;
  who.writes_optimizer = who.writes_expert_optimizer = false;
  auto snap = take_snapshot(c, model.params(), optim, state, who, false);
  write_checkpoint(dir, *snap, *ProcessGroups::single().checkpoint);
}

Config moe_of(Config c, int64_t granularity, const std::string& save) {
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = *c.model.ffn_hidden_size / granularity;
  c.moe.moe_use_upcycling = true;
  c.moe.moe_upcycling_granularity = granularity;
  c.checkpoint.save = save;
  c.training.seed = 77;  // (another seed than the dense model's: initial values are told apart from loaded ones)
  resolve(c, 1);
  return c;
}

TrainState upcycle(const Config& moe, GPTModel& model, const std::string& dense_dir) {
  Optimizer optim(moe, model.params(), ProcessGroups::single());
  LossScaler scaler(moe);
  LoadOptions lo;
  lo.load_optimizer = false;
  lo.run_config = &moe;
  lo.upcycle = true;
  return load_checkpoint(dense_dir, lo, model.params(), optim, scaler);
}

std::vector<float> values(const ParamStore& ps, const std::string& name) {
  const size_t i = ps.index_of(name);
  REQUIRE(i != kNoParam);
  return {ps.param(i), ps.param(i) + ps.info(i).numel};
}

}  // namespace

TEST_CASE("upcycling at granularity 2: each expert a scaled half of the dense MLP, the router's rows in pairs") {
  TempDir dense_dir, save_dir;
  Config dense = tiny_decoder(true);  // SwiGLU, ffn 24
  dense.training.seed = 5;
  resolve(dense, 1);
  GPTModel dense_model(dense, ProcessGroups::single());
  save_dense(dense, dense_model, dense_dir.str());
  Config moe = moe_of(dense, 2, save_dir.str());
  moe.moe.moe_shared_expert_intermediate_size = 8;
  resolve(moe, 1);
  GPTModel fresh(moe, ProcessGroups::single()), model(moe, ProcessGroups::single());
  const TrainState st = upcycle(moe, model, dense_dir.str());
  CHECK(st.iteration == 0);
  CHECK(st.flops_so_far == 0);
  CHECK(st.consumed_samples == 64);
  CHECK(st.lr_schedule_start_samples == 64);
  const ParamStore &d = dense_model.params(), &m = model.params();
  const float scale = static_cast<float>(std::cbrt(2.0));  // (SwiGLU: the cube root of the activation scale g)
  CHECK(upcycling_weight_scale(moe) == Approx(std::cbrt(2.0)));
  const int64_t h = 16, F = 12;
  for (int64_t l = 0; l < 2; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    CHECK(values(m, p + "attention.qkv.weight") == values(d, p + "attention.qkv.weight"));
    CHECK(values(m, p + "mlp_norm.weight") == values(d, p + "mlp_norm.weight"));
    for (int64_t e = 0; e < 4; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      const int64_t slice = e % 2;
      for (const char* fc1 : {"fc1_gate.weight", "fc1_up.weight"}) {
        const auto dw = values(d, p + "mlp." + fc1), ew = values(m, x + fc1);
        REQUIRE(ew.size() == static_cast<size_t>(F * h));
        for (int64_t i = 0; i < F * h; ++i) CHECK(ew[static_cast<size_t>(i)] == dw[static_cast<size_t>(slice * F * h + i)] * scale);
      }
      const auto dw = values(d, p + "mlp.fc2.weight"), ew = values(m, x + "fc2.weight");  // [h, 2F] -> [h, F]: columns
      for (int64_t r = 0; r < h; ++r) {
        for (int64_t c = 0; c < F; ++c) CHECK(ew[static_cast<size_t>(r * F + c)] == dw[static_cast<size_t>(r * 2 * F + slice * F + c)] * scale);
      }
    }
    for (const char* shared : {"fc1_gate.weight", "fc1_up.weight", "fc2.weight"}) {  // (the shared expert: its initial values)
      CHECK(values(m, p + "mlp.shared_experts." + shared) == values(fresh.params(), p + "mlp.shared_experts." + shared));
    }
    const auto router = values(m, p + "mlp.router.weight"), initial = values(fresh.params(), p + "mlp.router.weight");
    for (int64_t e = 0; e < 4; ++e) {
      for (int64_t c = 0; c < h; ++c) CHECK(router[static_cast<size_t>(e * h + c)] == initial[static_cast<size_t>((e / 2) * h + c)]);
    }
  }
  CHECK(values(m, "embedding.word_embeddings.weight") == values(d, "embedding.word_embeddings.weight"));
  CHECK(values(m, "output_layer.weight") == values(d, "output_layer.weight"));
}

TEST_CASE("upcycling GELU experts with biases at granularity 2: fc1's bias sliced and scaled, fc2's copied, the router's bias in pairs") {
  TempDir dense_dir, save_dir;
  Config dense = tiny_decoder(false);  // GPT: GELU, biases, ffn 20
  dense.training.seed = 5;
  resolve(dense, 1);
  GPTModel dense_model(dense, ProcessGroups::single());
  ParamStore& d = dense_model.params();
  for (size_t i = 0; i < d.size(); ++i) {  // biases away from their zero initial values
    if (d.info(i).name.find("bias") == std::string::npos) continue;
    for (int64_t e = 0; e < d.info(i).numel; ++e) d.param(i)[e] = 0.01f * static_cast<float>(e + 1);
  }
  save_dense(dense, dense_model, dense_dir.str());
  const Config moe = moe_of(dense, 2, save_dir.str());
  GPTModel fresh(moe, ProcessGroups::single()), model(moe, ProcessGroups::single());
  upcycle(moe, model, dense_dir.str());
  const float scale = static_cast<float>(std::sqrt(2.0));  // (GELU: the square root of the activation scale g)
  const ParamStore& m = model.params();
  const int64_t F = 10;
  for (int64_t e = 0; e < 4; ++e) {
    const std::string x = "layers.1.mlp.experts." + std::to_string(e) + ".";
    const auto db1 = values(d, "layers.1.mlp.fc1.bias"), eb1 = values(m, x + "fc1.bias");
    for (int64_t i = 0; i < F; ++i) CHECK(eb1[static_cast<size_t>(i)] == db1[static_cast<size_t>((e % 2) * F + i)] * scale);
    CHECK(values(m, x + "fc2.bias") == values(d, "layers.1.mlp.fc2.bias"));
  }
  const auto bias = values(m, "layers.1.mlp.router.bias"), initial = values(fresh.params(), "layers.1.mlp.router.bias");
  for (int64_t e = 0; e < 4; ++e) CHECK(bias[static_cast<size_t>(e)] == initial[static_cast<size_t>(e / 2)]);
}

TEST_CASE("upcycling at granularity 1: copies; the dropless top-2 model computes the dense model's loss") {
  for (const bool llama : {true, false}) {  // SwiGLU without biases; GELU with biases (fc2's bias copied, unscaled)
    TempDir dense_dir, save_dir;
    Config dense = tiny_decoder(llama);
    dense.training.seed = 5;
    resolve(dense, 1);
    GPTModel dense_model(dense, ProcessGroups::single());
    if (!llama) {  // biases away from their zero initial values
      ParamStore& ps = dense_model.params();
      for (size_t i = 0; i < ps.size(); ++i) {
        if (ps.info(i).name.find("bias") == std::string::npos) continue;
        for (int64_t e = 0; e < ps.info(i).numel; ++e) ps.param(i)[e] = 0.1f * static_cast<float>((e % 7) - 3);
      }
    }
    save_dense(dense, dense_model, dense_dir.str());
    Config moe = moe_of(dense, 1, save_dir.str());
    GPTModel model(moe, ProcessGroups::single());
    upcycle(moe, model, dense_dir.str());
    CHECK(upcycling_weight_scale(moe) == 1.0);
    const Microbatch mb = tiny_batch();
    const double dense_loss = dense_model.forward(mb, 1), moe_loss = model.forward(mb, 1);
    (void)model.take_moe_stats();
    CHECK(moe_loss == Approx(dense_loss).epsilon(1e-6));
    if (!llama) CHECK(values(model.params(), "layers.0.mlp.experts.3.fc2.bias") == values(dense_model.params(), "layers.0.mlp.fc2.bias"));
  }
}

TEST_CASE("upcycling refuses an MoE checkpoint, another model, and a --save that holds a checkpoint") {
  TempDir dense_dir, save_dir;
  Config dense = tiny_decoder(true);
  GPTModel dense_model(dense, ProcessGroups::single());
  save_dense(dense, dense_model, dense_dir.str());
  SECTION("another model: the experts' width times the granularity is not the dense MLP's") {
    Config moe = moe_of(dense, 2, save_dir.str());
    moe.moe.moe_ffn_hidden_size = 8;
    resolve(moe, 1);
    GPTModel model(moe, ProcessGroups::single());
    CHECK_THROWS_WITH(upcycle(moe, model, dense_dir.str()), MT_CONTAINS("--moe-upcycling-granularity"));
  }
  SECTION("a --save directory already used") {
    const Config moe = moe_of(dense, 1, dense_dir.str());
    GPTModel model(moe, ProcessGroups::single());
    CHECK_THROWS_WITH(upcycle(moe, model, dense_dir.str()), MT_CONTAINS("first run only"));
  }
  SECTION("an MoE model's checkpoint") {
    TempDir moe_dir;
    Config moe = moe_of(dense, 1, save_dir.str());
    GPTModel model(moe, ProcessGroups::single());
    save_dense(moe, model, moe_dir.str());
    CHECK_THROWS_WITH(upcycle(moe, model, moe_dir.str()), MT_CONTAINS("holds an MoE model already"));
  }
}
