// test_fp8_delayed.cpp: FP8 delayed scaling (model/fp8_scaling.h) against values worked by hand: the amax
// history's roll, most_recent and max, the margin, a zero, infinite or tiny amax; the state's checkpoint layout (an
// MoE layer's experts' sites too); a CPU training run, dense or MoE, that resumes from a checkpoint exactly as it
// would have gone on (the scales and histories saved and restored); and the amaxes reduced over DP unless --tp-only-amax-red.
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <limits>

#include "catch.h"
#include "checkpoint/checkpoint.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/yaml_io.h"
#include "model/fp8_scaling.h"
#include "model/gpt_model.h"
#include "train/trainer.h"
#include "fake_groups.h"
#include "tiny_models.h"

namespace {

// One tensor's history (entry 0 the accumulator) and scale through one update.
struct Updated {
  std::vector<float> history;
  float scale;
};
Updated update(std::vector<float> history, float scale, bool max_algo, float scaled_max = 448.0f) {
  const float s = mt::fp8_delayed_update(history.data(), 1, static_cast<int64_t>(history.size()), max_algo, scaled_max, scale);
  return {history, s};
}

}  // namespace

TEST_CASE("fp8 delayed: the update rolls the history and takes the scale from the newest amax or the history's max") {
  // Length 1, most_recent (Megatron's default): the amax of the last casts, then the accumulator starts again.
  Updated u = update({2.0f}, 1.0f, false);
  CHECK(u.scale == 224.0f);  // 448 / 2
  CHECK(u.history == std::vector<float>{0.0f});
  // Length 3: [accumulator 5, older 10, newer 3] -> the 5 moves to the end, the 10 leaves: [0, 3, 5].
  u = update({5.0f, 10.0f, 3.0f}, 1.0f, false);
  CHECK(u.history == std::vector<float>({0.0f, 3.0f, 5.0f}));
  CHECK(u.scale == 89.6f);  // most_recent: 448 / 5
  u = update({5.0f, 10.0f, 3.0f}, 1.0f, true);
  CHECK(u.history == std::vector<float>({0.0f, 3.0f, 5.0f}));
  CHECK(u.scale == 44.8f);  // max over {10, 3, 5} (the leaving entry counts once more, as TE's fused update)
  u = update(u.history, u.scale, true);  // nothing cast since: history and scale stay
  CHECK(u.history == std::vector<float>({0.0f, 3.0f, 5.0f}));
  CHECK(u.scale == 44.8f);
  // The margin: scales 2^margin lower; E5M2's maximum for gradients.
  mt::Fp8DelayedRecipe r;
  r.margin = 2;
  CHECK(r.scaled_max(true) == 112.0f);
  CHECK(r.scaled_max(false) == 14336.0f);
  CHECK(update({4.0f}, 1.0f, false, r.scaled_max(false)).scale == 3584.0f);
  // An infinite amax rolls in but leaves the scale; a tiny one caps it at the largest float.
  const float inf = std::numeric_limits<float>::infinity();
  u = update({inf, 1.0f}, 7.0f, true);
  CHECK(u.scale == 7.0f);
  CHECK(u.history[1] == inf);
  CHECK(update({1e-40f}, 1.0f, false).scale == FLT_MAX);
}

TEST_CASE("fp8 delayed: the state updates every kind's slots and keeps its layout through a checkpoint's layer entry") {
  mt::Fp8DelayedRecipe r;
  r.history_len = 2;
  mt::Fp8ScalingState st(r, {3, 4});
  REQUIRE(st.slots() == 8);
  CHECK(st.scales(mt::kFp8GradOutput)[7] == 1.0f);
  st.amax_accumulator(mt::kFp8Input)[1] = 4.0f;        // layer 3, projection's input
  st.amax_accumulator(mt::kFp8GradOutput)[6] = 2.0f;   // layer 4, fc1's output gradient
  st.update(mt::kFp8Input, mt::kFp8Weight);
  CHECK(st.scales(mt::kFp8Input)[1] == 112.0f);
  CHECK(st.scales(mt::kFp8GradOutput)[6] == 1.0f);     // (the backward's kind not updated yet)
  st.update(mt::kFp8GradOutput, mt::kFp8GradOutput);
  CHECK(st.scales(mt::kFp8GradOutput)[6] == 28672.0f);  // 57344 / 2
  const std::vector<float> entry = st.layer_state(1);
  REQUIRE(entry.size() == static_cast<size_t>(mt::fp8_layer_state_size(2)));
  // [site][kind][scale, history 0, history 1]: fc1 (site 2), output gradient (kind 2).
  CHECK(entry[(2 * 3 + 2) * 3] == 28672.0f);
  CHECK(entry[(2 * 3 + 2) * 3 + 2] == 2.0f);
  mt::Fp8ScalingState other(r, {3, 4});
  REQUIRE(other.set_layer_state(1, entry, 2));
  CHECK(other.layer_state(1) == entry);
  mt::Fp8DelayedRecipe longer = r;
  longer.history_len = 4;
  mt::Fp8ScalingState resized(longer, {4});
  REQUIRE(resized.set_layer_state(0, entry, 2));  // another history length: the scales, a fresh history
  CHECK(resized.scales(mt::kFp8GradOutput)[2] == 28672.0f);
  CHECK(resized.amax_accumulator(mt::kFp8GradOutput)[2 + 3 * 4] == 0.0f);
  CHECK_FALSE(resized.set_layer_state(0, {1.0f, 2.0f}, 2));
}

TEST_CASE("fp8 delayed: an MoE layer's experts have sites of their own after the layer's, and its checkpoint entry carries them") {
  mt::Fp8DelayedRecipe r;
  r.history_len = 2;
  mt::Fp8ScalingState st(r, {0, 1, 2}, {0, 3, 0});  // layer 1: an MoE layer of 3 experts
  REQUIRE(st.slots() == 4 + 10 + 4);
  CHECK(st.slot(1, 2) == 6);  // (fc1's site: the shared expert's)
  CHECK(st.slot(1, mt::fp8_expert_site(2, true)) == 4 + 4 + 5);  // expert 2's fc2
  CHECK(st.slot(2, 0) == 14);
  st.amax_accumulator(mt::kFp8Input)[st.slot(1, mt::fp8_expert_site(1, false))] = 8.0f;  // expert 1's fc1 input
  st.update(mt::kFp8Input, mt::kFp8GradOutput);
  CHECK(st.scales(mt::kFp8Input)[st.slot(1, mt::fp8_expert_site(1, false))] == 56.0f);  // 448 / 8
  CHECK(st.scales(mt::kFp8Input)[st.slot(1, mt::fp8_expert_site(0, false))] == 1.0f);
  const std::vector<float> entry = st.layer_state(1);
  REQUIRE(entry.size() == static_cast<size_t>(mt::fp8_layer_state_size(2, 3)));
  CHECK(entry[static_cast<size_t>((mt::fp8_expert_site(1, false) * 3 + mt::kFp8Input) * 3)] == 56.0f);
  mt::Fp8ScalingState other(r, {1}, {3});
  REQUIRE(other.set_layer_state(0, entry, 2));
  CHECK(other.layer_state(0) == entry);
  CHECK_FALSE(other.set_layer_state(0, st.layer_state(0), 2));  // a dense layer's entry: another size
  mt::Fp8ScalingState dense(r, {1});
  CHECK_FALSE(dense.set_layer_state(0, entry, 2));
}

namespace {

mt::Config tiny_delayed(int64_t iters, const std::string& dir, bool moe = false) {
  mt::Config c;
  mt::apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
  c.data.text_data_path = std::string(MEGATRAIN_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt";
  c.training.train_iters = iters;
  c.training.global_batch_size = 2 * *c.training.micro_batch_size;  // two microbatches: per-microbatch updates
  c.logging.eval_interval = 1000;
  c.logging.eval_iters = 0;
  c.precision.bf16 = true;
  c.precision.fp8_format = "hybrid";
  c.precision.fp8_recipe = "delayed";
  c.precision.fp8_amax_history_len = 4;
  c.precision.fp8_amax_compute_algo = "max";
  if (!dir.empty()) {
    c.checkpoint.save = dir;
    c.checkpoint.save_interval = 3;
  }
  if (moe) {  // every layer an MoE layer of 4 experts with a shared expert: each expert's sites scaled on their own
    c.moe.num_experts = 4;
    c.moe.moe_router_topk = 2;
    c.moe.moe_aux_loss_coeff = {1e-2};
    c.moe.moe_shared_expert_intermediate_size = 32;
  }
  REQUIRE(mt::validate(c, 1, mt::Purpose::kTrain).ok());
  mt::resolve(c, 1, 257);
  return c;
}

}  // namespace

TEST_CASE("fp8 delayed: a CPU run resumed from its checkpoint goes on exactly as without the stop") {
  for (bool moe : {false, true}) {
    INFO((moe ? "MoE layers (each expert's scales)" : "dense layers"));
    const auto dir = std::filesystem::temp_directory_path() / "megatrain_fp8_delayed_resume";
    std::filesystem::remove_all(dir);
    const mt::TrainResult whole = mt::train(tiny_delayed(6, "", moe), mt::ProcessGroups::single(), {true, 0});
    const mt::TrainResult first = mt::train(tiny_delayed(3, dir.string(), moe), mt::ProcessGroups::single(), {true, 0});
    const mt::Fp8ScalingState* st = first.model->fp8_scaling();
    REQUIRE(st != nullptr);
    CHECK(st->scales(mt::kFp8Input)[0] != 1.0f);  // updated from the amaxes
    CHECK(st->scales(mt::kFp8GradOutput)[0] != 1.0f);
    if (moe) {  // an expert's sites too (expert 0's fc1 in layer 0)
      REQUIRE(st->experts[0] == 4);
      CHECK(st->scales(mt::kFp8Input)[st->slot(0, mt::fp8_expert_site(0, false))] != 1.0f);
      CHECK(st->scales(mt::kFp8GradOutput)[st->slot(0, mt::fp8_expert_site(3, true))] != 1.0f);
    }
    const std::string info = mt::inspect_checkpoint(dir.string(), std::nullopt, true);
    CHECK_THAT(info, MT_CONTAINS(moe ? "FP8 delayed scaling: the scales and amax histories (4 entries) of 2 layers, with the experts of 2 MoE layers (8 in all)"
                                     : "FP8 delayed scaling: the scales and amax histories (4 entries) of 2 layers\n"));
    mt::Config more = tiny_delayed(6, "", moe);
    more.checkpoint.load = dir.string();
    const mt::TrainResult resumed = mt::train(more, mt::ProcessGroups::single(), {true, 0});
    REQUIRE(whole.losses.size() == 6);
    REQUIRE(resumed.losses.size() >= 3);
    for (size_t i = 0; i < 3; ++i) CHECK(resumed.losses[resumed.losses.size() - 3 + i] == whole.losses[3 + i]);
    // And the state it ends with is the uninterrupted run's (scales, histories, the weights' cast scales aside).
    mt::Fp8ScalingState* restored = resumed.model->fp8_scaling();
    REQUIRE(restored != nullptr);
    CHECK(restored->layer_state(0) == whole.model->fp8_scaling()->layer_state(0));
    CHECK(restored->layer_state(1) == whole.model->fp8_scaling()->layer_state(1));
    std::filesystem::remove_all(dir);
  }
}

namespace {

// A DP group of two played by rank 0: a MAX all-reduce meets a second rank whose every amax is `other`.
class DpWithLargerAmaxes final : public mt::test::NoCollectives {
 public:
  explicit DpWithLargerAmaxes(float other) : NoCollectives(0, 2), other_(other) {}
  void all_reduce(float* x, int64_t n, mt::ReduceOp op) override {
    if (op != mt::ReduceOp::kMax) fail();
    for (int64_t i = 0; i < n; ++i) x[i] = std::fmax(x[i], other_);
    ++max_reductions;
  }
  int max_reductions = 0;

 private:
  float other_;
};

}  // namespace

TEST_CASE("fp8 delayed: the amaxes are reduced over DP, and with --tp-only-amax-red a DP rank keeps its own") {
  for (bool tp_only : {false, true}) {
    mt::Config c = mt::test::tiny_decoder(true);
    c.precision.bf16 = true;
    c.precision.fp8_format = "hybrid";
    c.precision.fp8_recipe = "delayed";
    c.precision.fp8_amax_history_len = 2;
    c.precision.tp_only_amax_red = tp_only;
    mt::ProcessGroups groups = mt::ProcessGroups::single();
    auto dp = std::make_shared<DpWithLargerAmaxes>(1024.0f);  // far above what the tiny model's tensors reach
    groups.dp_cp = dp;
    mt::GPTModel m(c, groups);
    const mt::Microbatch mb = mt::test::tiny_batch();
    m.forward_stage(0, mb, 1, true, {}, nullptr);
    m.backward_stage(0, 1.0f, true, {}, nullptr);
    const mt::Fp8ScalingState& st = *m.fp8_scaling();
    REQUIRE(st.slots() > 0);
    int other_rank_scales = 0;  // the scales that come from the other rank's amax: max / 1024
    for (int kind : {mt::kFp8Input, mt::kFp8Weight, mt::kFp8GradOutput}) {
      const float from_other = (kind == mt::kFp8GradOutput ? 57344.0f : 448.0f) / 1024.0f;
      for (int64_t i = 0; i < st.slots(); ++i) other_rank_scales += st.scales(kind)[i] == from_other;
    }
    INFO((tp_only ? "--tp-only-amax-red" : "default") << ": " << dp->max_reductions << " reductions over DP");
    if (tp_only) {
      CHECK(dp->max_reductions == 0);
      CHECK(other_rank_scales == 0);
    } else {
      CHECK(dp->max_reductions == 2);  // the forward's update and the backward's
      CHECK(other_rank_scales == 3 * st.slots());
    }
  }
}
