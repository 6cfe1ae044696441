// test_moe.cpp: the MoE router's math against finite differences (both score functions, pre-softmax, scaling,
// group-limited choice, ties), the auxiliary losses' and z-loss's gradients, capacity dropping on a hand-worked
// example, Megatron's --moe-layer-freq forms, and whole-model gradient checks of MoE layers (router, experts,
// shared expert, every load-balancing type) on one rank.
#include <cmath>
#include <numeric>

#include "catch.h"
#include "config/yaml_io.h"
#include "config/errors.h"
#include "config/moe_pattern.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "grad_check.h"
#include "kernels/cpu/router.h"
#include "model/gpt_model.h"
#include "model/regroup_rows.h"
#include "tensor/device_info.h"
#include "tiny_models.h"
#include "train/capabilities.h"

using namespace mt;
using namespace mt::cpu;
using namespace mt::test;

namespace {

// Random logits with well separated values (no top-k choice flips under the finite-difference step).
std::vector<float> separated_logits(int64_t n, int64_t E, unsigned seed) {
  std::vector<float> x(static_cast<size_t>(n * E));
  fill_normal(x, seed, 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x[static_cast<size_t>(t * E + a)] < x[static_cast<size_t>(t * E + b)]; });
    for (int64_t r = 0; r < E; ++r) x[static_cast<size_t>(t * E + order[static_cast<size_t>(r)])] = 0.4f * static_cast<float>(r) + 0.05f * x[static_cast<size_t>(t * E + order[static_cast<size_t>(r)])];
  }
  return x;
}

void check_router(const RouterSettings& s) {
  const int64_t n = 5, E = s.experts, k = s.topk;
  std::vector<float> logits = separated_logits(n, E, 11);
  std::vector<float> dweight(static_cast<size_t>(n * k));
  fill_normal(dweight, 3);
  std::vector<int32_t> top(static_cast<size_t>(n * k));
  std::vector<float> weight(static_cast<size_t>(n * k)), dlogits(static_cast<size_t>(n * E));
  route_topk(s, logits.data(), nullptr, n, top.data(), weight.data());
  route_topk_backward(s, logits.data(), top.data(), dweight.data(), n, dlogits.data());
  auto f = [&] {
    std::vector<int32_t> t2(top.size());
    std::vector<float> w2(weight.size());
    route_topk(s, logits.data(), nullptr, n, t2.data(), w2.data());
    REQUIRE(t2 == top);  // the choice did not move under the step
    double v = 0;
    for (size_t i = 0; i < w2.size(); ++i) v += static_cast<double>(w2[i]) * dweight[i];
    return v;
  };
  std::vector<double> a, num;
  for (size_t i = 0; i < logits.size(); ++i) {
    num.push_back(numeric_grad(f, &logits[i], 1e-2));
    a.push_back(dlogits[i]);
  }
  CHECK(worst_ratio(a, num, 1e-4, 1e-3) <= 1.0);
}

}  // namespace

TEST_CASE("router: the routing weights' gradient, every score function") {
  RouterSettings s;
  s.experts = 6;
  s.topk = 2;
  SECTION("softmax over the chosen (Mixtral)") { check_router(s); }
  SECTION("softmax over all experts first (pre-softmax), scaled") {
    s.pre_softmax = true;
    s.scaling = 2.5f;
    check_router(s);
  }
  SECTION("sigmoid, normalised over the chosen") {
    s.score = ScoreFunction::kSigmoid;
    check_router(s);
  }
  SECTION("sigmoid, top-1 (not normalised)") {
    s.score = ScoreFunction::kSigmoid;
    s.topk = 1;
    check_router(s);
  }
  SECTION("sqrtsoftplus, normalised over the chosen") {
    s.score = ScoreFunction::kSqrtSoftplus;
    check_router(s);
  }
  SECTION("sqrtsoftplus, top-1 (not normalised)") {
    s.score = ScoreFunction::kSqrtSoftplus;
    s.topk = 1;
    check_router(s);
  }
  SECTION("group-limited") {
    s.num_groups = 3;
    s.group_topk = 2;
    check_router(s);
  }
}

TEST_CASE("router: top-k choices as Megatron's (descending, ties to the lower expert, groups, bias for the choice only)") {
  RouterSettings s;
  s.experts = 4;
  s.topk = 2;
  const std::vector<float> tied = {0.5f, 1.0f, 1.0f, 0.2f};
  std::vector<int32_t> top(2);
  std::vector<float> w(2);
  route_topk(s, tied.data(), nullptr, 1, top.data(), w.data());
  CHECK(top == std::vector<int32_t>{1, 2});
  CHECK(w[0] == Approx(0.5f));
  // Group-limited: groups {0,1} and {2,3} scored by their best expert (topk / group_topk = 1): 1.0 vs 1.0 -> the
  // lower group; both choices from it.
  s.num_groups = 2;
  s.group_topk = 1;
  route_topk(s, tied.data(), nullptr, 1, top.data(), w.data());
  CHECK(top == std::vector<int32_t>{1, 0});
  // Sigmoid with an expert bias: the bias moves the choice, the weights are the unbiased scores normalised.
  RouterSettings sg;
  sg.experts = 4;
  sg.topk = 2;
  sg.score = ScoreFunction::kSigmoid;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f}, bias = {10.0f, 0.0f, 0.0f, 0.0f};
  route_topk(sg, logits.data(), bias.data(), 1, top.data(), w.data());
  CHECK(top == std::vector<int32_t>{0, 3});
  const double s0 = 0.5, s3 = 1.0 / (1.0 + std::exp(-3.0));
  CHECK(w[0] == Approx(s0 / (s0 + s3)));
  CHECK(w[1] == Approx(s3 / (s0 + s3)));
  // sqrtsoftplus (Megatron's: sqrt(softplus(x)), torch's softplus x itself above 20), normalised over the chosen.
  sg.score = ScoreFunction::kSqrtSoftplus;
  const std::vector<float> wide = {-1.0f, 25.0f, 0.5f, 2.0f};
  route_topk(sg, wide.data(), nullptr, 1, top.data(), w.data());
  CHECK(top == std::vector<int32_t>{1, 3});
  const double q1 = std::sqrt(25.0), q3 = std::sqrt(std::log1p(std::exp(2.0)));
  CHECK(w[0] == Approx(q1 / (q1 + q3)));
  CHECK(w[1] == Approx(q3 / (q1 + q3)));
  sg.topk = 1;  // (top-1: the score itself, not normalised)
  route_topk(sg, wide.data(), nullptr, 1, top.data(), w.data());
  CHECK(top[0] == 1);
  CHECK(w[0] == Approx(q1));
  const std::vector<float> huge = {800.0f, 0.0f, 0.0f, 0.0f};  // (above torch's threshold: the logit itself, finite)
  route_topk(sg, huge.data(), nullptr, 1, top.data(), w.data());
  CHECK(w[0] == Approx(std::sqrt(800.0)));
}

TEST_CASE("capacity: a hand-worked example of both drop policies and padding") {
  // 4 tokens, top-1 over 2 experts, factor 1: capacity ceil(4 * 1 / 2 * 1.0) = 2 per expert.
  CHECK(expert_capacity(1.0, 4, 1, 2) == 2);
  CHECK(expert_capacity(1.25, 10, 2, 8) == 4);  // ceil(20 / 8 * 1.25) = ceil(3.125)
  const std::vector<int32_t> top = {0, 0, 0, 1};
  const std::vector<float> weight = {0.9f, 0.6f, 0.8f, 0.7f};
  std::vector<uint8_t> keep(4);
  capacity_keep(top.data(), weight.data(), megatron_token_order(4, 4), 1, 2, 2, true, keep.data());
  CHECK(keep == std::vector<uint8_t>{1, 0, 1, 1});  // probs: expert 0 keeps 0.9 and 0.8, drops token 1
  capacity_keep(top.data(), weight.data(), megatron_token_order(4, 4), 1, 2, 2, false, keep.data());
  CHECK(keep == std::vector<uint8_t>{1, 1, 0, 1});  // position: the earliest two
  const auto pad = capacity_padding(top.data(), keep.data(), megatron_token_order(4, 4), 1, 2, 2);
  CHECK(pad[0].empty());
  CHECK(pad[1] == std::vector<int64_t>{0});  // expert 1 filled to 2 rows with the first token it does not route
  // Two sequences of 2 (rows b * 2 + s): Megatron's order is position first, [s0b0, s0b1, s1b0, s1b1] = rows 0, 2,
  // 1, 3, so `position` keeps rows 0 and 2 (the first position of both sequences), not the first sequence.
  capacity_keep(top.data(), weight.data(), megatron_token_order(4, 2), 1, 2, 2, false, keep.data());
  CHECK(keep == std::vector<uint8_t>{1, 0, 1, 1});
}

TEST_CASE("the CUDA engine's host placement of the experts' rows: drops, pads, a TP rank's slice, alignment") {
  // 4 tokens, top-2 over 3 experts; token 3's choice of expert 0 dropped; padding: expert 1 takes token 2, expert 2
  // token 3. Each expert's rows in token order, its pads among them by token.
  const std::vector<int32_t> top = {0, 1, 1, 2, 0, 2, 1, 0};
  const std::vector<uint8_t> keep = {1, 1, 1, 1, 1, 1, 1, 0};
  const std::vector<std::vector<int64_t>> pads = {{}, {2}, {3}};
  // Every token: expert 0 rows 0-1 (t0, t2), expert 1 rows 2-5 (t0, t1, pad t2, t3), expert 2 rows 6-8 (t1, t2, pad t3).
  ExpertRows all = place_expert_rows(top.data(), keep.data(), pads, 4, 2, 3, 0, 4, 1);
  CHECK(all.per_expert == std::vector<int32_t>{2, 4, 3});
  CHECK(all.row == std::vector<int32_t>{0, 2, 3, 6, 1, 7, 5, -1});
  CHECK(all.pad_map == std::vector<int32_t>{4, 2, 8, 3});
  // The second of two TP ranks' slices (tokens 2 and 3): the first slice's choices get no row, its pads stay.
  ExpertRows second = place_expert_rows(top.data(), keep.data(), pads, 4, 2, 3, 2, 4, 1);
  CHECK(second.per_expert == std::vector<int32_t>{1, 2, 2});
  CHECK(second.row == std::vector<int32_t>{-1, -1, -1, -1, 0, 3, 2, -1});
  CHECK(second.pad_map == std::vector<int32_t>{1, 2, 4, 3});
  // The first slice, each expert's block at a multiple of 16 (FP8): the other slice's pads left out.
  ExpertRows first = place_expert_rows(top.data(), keep.data(), pads, 4, 2, 3, 0, 2, 16);
  CHECK(first.per_expert == std::vector<int32_t>{1, 2, 1});
  CHECK(first.row == std::vector<int32_t>{0, 16, 17, 32, -1, -1, -1, -1});
  CHECK(first.pad_map.empty());
  // Without pads (no padding to capacity).
  ExpertRows plain = place_expert_rows(top.data(), keep.data(), {}, 4, 2, 3, 0, 4, 1);
  CHECK(plain.per_expert == std::vector<int32_t>{2, 3, 2});
  CHECK(plain.row == std::vector<int32_t>{0, 2, 3, 5, 1, 6, 4, -1});
}

TEST_CASE("expert-TP's block moves: rank-major blocks padded to the largest count <-> expert-major rows") {
  // Two expert-TP ranks, two local experts: rank 0 brings 1 row of expert 0 and 2 of expert 1, rank 1 one row of
  // expert 1; blocks of 3 rows (rank 1's last two rows unused).
  const std::vector<std::vector<int64_t>> counts = {{1, 2}, {0, 1}};
  const auto to_experts = padded_block_moves(counts, 3, true);
  REQUIRE(to_experts.size() == 3);
  CHECK((to_experts[0].from == 0 && to_experts[0].to == 0 && to_experts[0].rows == 1));  // rank 0's expert 0
  CHECK((to_experts[1].from == 1 && to_experts[1].to == 1 && to_experts[1].rows == 2));  // rank 0's expert 1
  CHECK((to_experts[2].from == 3 && to_experts[2].to == 3 && to_experts[2].rows == 1));  // rank 1's expert 1, from its block
  const auto back = padded_block_moves(counts, 3, false);
  REQUIRE(back.size() == 3);
  CHECK((back[2].from == 3 && back[2].to == 3 && back[2].rows == 1));
  // Blocks larger than every count: rank 1's rows start at its block.
  const auto wide = padded_block_moves({{1, 0}, {1, 1}}, 4, true);
  REQUIRE(wide.size() == 3);
  CHECK((wide[0].from == 0 && wide[0].to == 0));  // rank 0's expert 0
  CHECK((wide[1].from == 4 && wide[1].to == 1));  // rank 1's expert 0 after it
  CHECK((wide[2].from == 5 && wide[2].to == 2));  // rank 1's expert 1
}

TEST_CASE("auxiliary losses: the scores' and the z-loss's gradients") {
  const int64_t n = 4, E = 5;
  std::vector<float> logits(static_cast<size_t>(n * E)), dscores(static_cast<size_t>(n * E));
  fill_normal(logits, 5);
  fill_normal(dscores, 6);
  for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid, ScoreFunction::kSqrtSoftplus}) {
    std::vector<float> d(logits.size(), 0.0f);
    aux_scores_backward(logits.data(), dscores.data(), n, E, score, d.data());
    auto f = [&] {
      std::vector<float> sc(logits.size());
      aux_scores(logits.data(), n, E, score, sc.data());
      double v = 0;
      for (size_t i = 0; i < sc.size(); ++i) v += static_cast<double>(sc[i]) * dscores[i];
      return v;
    };
    std::vector<double> a, num;
    for (size_t i = 0; i < logits.size(); ++i) {
      num.push_back(numeric_grad(f, &logits[i], 1e-2));
      a.push_back(d[i]);
    }
    INFO("score function " << static_cast<int>(score));
    CHECK(worst_ratio(a, num, 1e-5, 1e-3) <= 1.0);
  }
  std::vector<float> dz(logits.size(), 0.0f);
  z_loss_backward(logits.data(), n, E, 0.5f, dz.data());
  std::vector<double> a, num;
  for (size_t i = 0; i < logits.size(); ++i) {
    num.push_back(numeric_grad([&] { return 0.5 * z_loss_sum(logits.data(), n, E); }, &logits[i], 1e-2));
    a.push_back(dz[i]);
  }
  CHECK(worst_ratio(a, num, 1e-5, 1e-3) <= 1.0);
}

TEST_CASE("--moe-layer-freq: Megatron's integer and list forms") {
  CHECK(parse_moe_layer_freq("1", 3) == std::vector<bool>{true, true, true});
  CHECK(parse_moe_layer_freq("2", 4) == std::vector<bool>{true, false, true, false});
  CHECK(parse_moe_layer_freq("[0]+[1]*3", 4) == std::vector<bool>{false, true, true, true});
  CHECK(parse_moe_layer_freq("([0]*1+[1]*1)*2", 4) == std::vector<bool>{false, true, false, true});
  CHECK(parse_moe_layer_freq("[1, 0, 1]", 3) == std::vector<bool>{true, false, true});
  // (still in the quotes a launcher script meant for a second shell, as Qwen3-MoE's Megatron scripts pass it)
  CHECK(parse_moe_layer_freq("'([1]*3)'", 3) == std::vector<bool>{true, true, true});
  CHECK(parse_moe_layer_freq("\"[0]+[1]*2\"", 3) == std::vector<bool>{false, true, true});
  CHECK(parse_moe_layer_freq("'2'", 4) == std::vector<bool>{true, false, true, false});
  CHECK_THROWS_AS(parse_moe_layer_freq("'[1]*3", 3), ConfigError);  // (unmatched)
  CHECK_THROWS_AS(parse_moe_layer_freq("[0]+[1]*3", 5), ConfigError);  // 4 entries for 5 layers
  CHECK_THROWS_AS(parse_moe_layer_freq("[0,2]", 2), ConfigError);
  CHECK_THROWS_AS(parse_moe_layer_freq("[0]+", 1), ConfigError);
  CHECK_THROWS_AS(parse_moe_layer_freq("0", 2), ConfigError);
  CHECK_THROWS_AS(parse_moe_layer_freq("import os", 2), ConfigError);
  // A YAML recipe's list (Megatron's YAML configs hold the pattern as a list): the same pattern, for --no-rope-freq too.
  Config c;
  apply_yaml_text(c, "moe_layer_freq: [0, 1, 1]\nno_rope_freq: [0, 0, 1]\n", "a recipe");
  CHECK(c.moe.moe_layer_freq == "[0,1,1]");
  CHECK(c.model.no_rope_freq == "[0,0,1]");
  CHECK(parse_moe_layer_freq(c.moe.moe_layer_freq, 3) == std::vector<bool>{false, true, true});
}

namespace {

// A 2-layer model whose second layer is MoE (4 experts, top-2, aux and z losses).
Config tiny_moe_decoder(bool llama) {
  Config c = tiny_decoder(llama, 2);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 8;
  c.moe.moe_layer_freq = "[0,1]";
  c.moe.moe_aux_loss_coeff = {0.5};
  c.moe.moe_z_loss_coeff = 0.1;
  return c;
}

// Every parameter of tiny_moe_decoder against central differences of the whole objective (lm loss + coeff x load
// balancing + coeff x z-loss).
void check_moe_model(bool llama, const std::function<void(Config&)>& set) {
  Config c = tiny_moe_decoder(llama);
  set(c);
  resolve(c, 1);
  GPTModel model(c, ProcessGroups::single());
  const Microbatch mb = tiny_batch();
  ParamStore& ps = model.params();
  ps.zero_grads();
  model.forward(mb, 1);
  (void)model.take_moe_stats();
  model.backward(1.0f);
  std::vector<float> analytic(ps.grads().f32(), ps.grads().f32() + ps.numel());
  // A step that moves a top-k choice or a drop makes the objective jump: such elements are left out (counted).
  double digest = -1;
  bool moved = false;
  auto objective = [&] {
    const double lm = model.forward(mb, 1);
    const cpu::MoeStats st = model.take_moe_stats();
    REQUIRE(st.size() == 1);
    const auto& layer = st.begin()->second;
    if (digest < 0) digest = layer.routing_digest;
    if (layer.routing_digest != digest) moved = true;
    double balance = 0;  // (each chosen load-balancing loss times its coefficient: one type, or Megatron's list form)
    for (size_t t = 0; t < 3; ++t) balance += c.moe.aux_loss_coeff(kAuxLossTypes[t]) * layer.aux[t];
    return lm + balance + *c.moe.moe_z_loss_coeff * layer.z;
  };
  int64_t checked = 0, left_out = 0;
  const double base = objective();
  model.forward(mb, 1);
  const cpu::MoeLayerStats first = model.take_moe_stats().begin()->second;
  for (size_t t = 0; t < 3; ++t) CHECK((first.aux[t] > 0) == (c.moe.aux_loss_coeff(kAuxLossTypes[t]) > 0));
  CHECK(first.z > 0);
  if (c.moe.moe_expert_capacity_factor) CHECK(first.dropped > 0);  // the capacity case does drop
  CHECK(std::isfinite(base));
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps.info(i);
    const int64_t stride = std::max<int64_t>(1, p.numel / 16);
    double num_sq = 0, diff_sq = 0;
    for (int64_t e = 0; e < p.numel; e += stride) {
      moved = false;
      const double n = numeric_grad(objective, ps.param(i) + e, 2e-2);
      if (moved) {
        ++left_out;
        continue;
      }
      ++checked;
      const double a = analytic[static_cast<size_t>(p.offset + e)];
      num_sq += n * n;
      diff_sq += (a - n) * (a - n);
    }
    INFO(p.name << ": |analytic - numeric| = " << std::sqrt(diff_sq) << ", |numeric| " << std::sqrt(num_sq));
    // (the floor: the fp32 forward's rounding through the central difference, about ulp(loss) / step = 5e-7 / 2e-2 per element,
    // up to 16 elements; the BLAS kernels, chosen by the CPU, move it: 1e-5 held on some CPUs, not on an AVX-512 EPYC)
    CHECK(std::sqrt(diff_sq) <= 3e-3 * std::sqrt(num_sq) + 8e-5);
  }
  INFO("elements whose step moved the routing: " << left_out << " of " << checked + left_out);
  CHECK(left_out * 4 <= checked);
}

}  // namespace

TEST_CASE("Megatron's list form of the load-balancing types: each loss as alone, the gradients summed") {
  // One forward and backward per configuration of the same weights: the list's losses equal each type's alone, and its
  // gradient minus the lm loss's alone is the sum of each type's share.
  struct Run {
    double aux[3];
    std::vector<float> grad;
  };
  auto run = [](const StringList& types, const FloatList& coeffs) {
    Config c = tiny_moe_decoder(true);
    c.moe.moe_router_load_balancing_type = types;
    c.moe.moe_aux_loss_coeff = coeffs;
    c.moe.moe_z_loss_coeff = 0.0;
    resolve(c, 1);
    GPTModel model(c, ProcessGroups::single());
    ParamStore& ps = model.params();
    ps.zero_grads();
    model.forward(tiny_batch(), 1);
    const cpu::MoeLayerStats st = model.take_moe_stats().begin()->second;
    model.backward(1.0f);
    return Run{{st.aux[0], st.aux[1], st.aux[2]}, std::vector<float>(ps.grads().f32(), ps.grads().f32() + ps.numel())};
  };
  const Run none = run({"none"}, {0.0});
  const Run both = run({"global_aux_loss", "aux_loss", "seq_aux_loss"}, {0.25, 0.5, 0.75});
  const Run aux = run({"aux_loss"}, {0.5}), seq = run({"seq_aux_loss"}, {0.75}), global = run({"global_aux_loss"}, {0.25});
  CHECK(both.aux[0] == aux.aux[0]);
  CHECK(both.aux[1] == seq.aux[1]);
  CHECK(both.aux[2] == global.aux[2]);
  CHECK(aux.aux[0] > 0);
  CHECK(seq.aux[1] > 0);
  CHECK(global.aux[2] > 0);
  CHECK(aux.aux[1] == 0);  // (a type not chosen: not computed)
  double diff = 0, scale = 0;
  for (size_t i = 0; i < none.grad.size(); ++i) {
    const double expected = double(aux.grad[i]) + seq.grad[i] + global.grad[i] - 2.0 * none.grad[i];
    diff = std::max(diff, std::abs(both.grad[i] - expected));
    scale = std::max(scale, std::abs(both.grad[i] - double(none.grad[i])));
  }
  INFO("largest difference " << diff << ", largest share of the balancing losses " << scale);
  CHECK(scale > 1e-4);
  CHECK(diff <= 1e-6 + 1e-4 * scale);
  if (built_with_cuda()) {  // (the CUDA engine: the list form, sqrtsoftplus and quantile balancing ran on a GPU; QB not with CP)
    Config c = tiny_moe_decoder(true);
    c.moe.moe_router_load_balancing_type = {"aux_loss", "seq_aux_loss"};
    c.moe.moe_aux_loss_coeff = {1e-2, 1e-3};
    resolve(c, 1);
    auto gaps = [](const Config& cfg) {
      std::string all;
      for (const auto& line : cuda_engine_gaps(cfg, 1)) all += line + "\n";
      return all;
    };
    CHECK_THAT(gaps(c), !MT_CONTAINS("auxiliary losses"));
    c.moe.moe_router_score_function = "sqrtsoftplus";
    CHECK_THAT(gaps(c), !MT_CONTAINS("sqrtsoftplus"));
    c.moe.moe_router_load_balancing_type = {"quantile_balancing"};
    c.moe.moe_aux_loss_coeff = {0.0};
    CHECK_THAT(gaps(c), !MT_CONTAINS("quantile_balancing"));
    c.parallel.context_parallel_size = 2;
    CHECK_THAT(gaps(c), MT_CONTAINS("quantile_balancing with context parallelism is not implemented on the CUDA engine"));
  }
}

TEST_CASE("whole-model gradient check: MoE layers (router, experts, shared expert, every balancing loss)") {
  SECTION("LLaMA: softmax top-2, aux_loss, z-loss, SwiGLU experts") { check_moe_model(true, [](Config&) {}); }
  SECTION("GPT: biases in the router and GELU experts, pre-softmax, scaled") {
    check_moe_model(false, [](Config& c) {
      c.moe.moe_router_pre_softmax = true;
      c.moe.moe_router_topk_scaling_factor = 1.5;
    });
  }
  SECTION("LLaMA: sqrtsoftplus scores (DeepSeek-V4's), aux_loss and seq_aux_loss, scaled") {
    check_moe_model(true, [](Config& c) {
      c.moe.moe_router_score_function = "sqrtsoftplus";
      c.moe.moe_router_topk_scaling_factor = 2.0;
      c.moe.moe_router_load_balancing_type = {"aux_loss", "seq_aux_loss"};
      c.moe.moe_aux_loss_coeff = {0.5, 0.25};
    });
  }
  SECTION("LLaMA: sigmoid, seq_aux_loss, a shared expert") {
    check_moe_model(true, [](Config& c) {
      c.moe.moe_router_score_function = "sigmoid";
      c.moe.moe_router_load_balancing_type = {"seq_aux_loss"};
      c.moe.moe_shared_expert_intermediate_size = 12;
    });
  }
  SECTION("LLaMA: the router's input jitter (--moe-input-jitter-eps)") {
    check_moe_model(true, [](Config& c) { c.moe.moe_input_jitter_eps = 0.3; });
  }
  SECTION("LLaMA: a shared expert with its gate (--moe-shared-expert-gate)") {
    check_moe_model(true, [](Config& c) {
      c.moe.moe_shared_expert_intermediate_size = 12;
      c.moe.moe_shared_expert_gate = true;
    });
  }
  SECTION("LLaMA: global_aux_loss") {
    check_moe_model(true, [](Config& c) { c.moe.moe_router_load_balancing_type = {"global_aux_loss"}; });
  }
  SECTION("LLaMA: Megatron's list form, aux_loss + seq_aux_loss + global_aux_loss, a coefficient each") {
    check_moe_model(true, [](Config& c) {
      c.moe.moe_router_load_balancing_type = {"seq_aux_loss", "aux_loss", "global_aux_loss"};
      c.moe.moe_aux_loss_coeff = {0.3, 0.5, 0.2};
    });
  }
  SECTION("LLaMA: the list form with one coefficient 0 (that loss neither computed nor logged)") {
    check_moe_model(true, [](Config& c) {
      c.moe.moe_router_load_balancing_type = {"aux_loss", "seq_aux_loss"};
      c.moe.moe_aux_loss_coeff = {0.0, 0.4};
    });
  }
  SECTION("LLaMA: sinkhorn routing, top-2 (the weights the softmax over all experts) and top-1 (sigmoid)") {
    for (const int64_t k : {2, 1}) {
      check_moe_model(true, [k](Config& c) {
        c.moe.moe_router_load_balancing_type = {"sinkhorn"};
        c.moe.moe_aux_loss_coeff = {0};
        c.moe.moe_router_topk = k;
        if (k == 1) c.moe.num_experts = 2;  // (as the top-1 case below: enough tokens per expert for gradients above the noise)
      });
    }
  }
  SECTION("LLaMA: capacity dropping") {
    check_moe_model(true, [](Config& c) { c.moe.moe_expert_capacity_factor = 1.0; });
  }
  SECTION("LLaMA: sigmoid top-1 with the routing weight on the expert's input (Llama 4's --moe-apply-probs-on-input)") {
    check_moe_model(true, [](Config& c) {  // (sigmoid: a softmax over one choice would make the weight 1, its gradient 0)
      c.moe.moe_router_score_function = "sigmoid";
      c.moe.num_experts = 2;  // (top-1 over 4 experts leaves one too few tokens for gradients above the differences' noise)
      c.moe.moe_router_topk = 1;
      c.moe.moe_apply_probs_on_input = true;
    });
  }
}

TEST_CASE("--moe-router-force-load-balancing: random logits from the token's place, the router's gradient straight through") {
  Config c = tiny_moe_decoder(true);
  c.moe.moe_router_force_load_balancing = true;
  resolve(c, 1);
  GPTModel model(c, ProcessGroups::single());
  const Microbatch mb = tiny_batch();
  ParamStore& ps = model.params();
  const ParamInfo& router = ps.info(ps.index_of("layers.1.mlp.router.weight"));
  ps.zero_grads();
  const double loss = model.forward(mb, 1);
  const cpu::MoeLayerStats first = model.take_moe_stats().begin()->second;
  model.backward(1.0f);
  // Megatron's RandomSTE: the backward treats the random logits as the router's, so its weight has a gradient.
  double norm = 0;
  for (int64_t e = 0; e < router.numel; ++e) norm += std::pow(ps.grads().f32()[router.offset + e], 2);
  CHECK(norm > 0);
  CHECK(first.z > 0);
  const std::vector<float> grad(ps.grads().f32() + router.offset, ps.grads().f32() + router.offset + router.numel);
  // The forward reads no router weight: scaled, the same loss, routing and losses, and the same router gradient (taken
  // at the random logits, not at the router's own).
  for (int64_t e = 0; e < router.numel; ++e) ps.params().f32()[router.offset + e] *= 3.0f;
  ps.zero_grads();
  CHECK(model.forward(mb, 1) == loss);
  const cpu::MoeLayerStats again = model.take_moe_stats().begin()->second;
  model.backward(1.0f);
  CHECK(std::vector<float>(ps.grads().f32() + router.offset, ps.grads().f32() + router.offset + router.numel) == grad);
  CHECK(again.routing_digest == first.routing_digest);
  for (size_t t = 0; t < 3; ++t) CHECK(again.aux[t] == first.aux[t]);
  CHECK(again.z == first.z);
  // Other samples (their global indices): other logits, another routing.
  Microbatch later = mb;
  later.first_sample += 1000;
  model.forward(later, 1);
  CHECK(model.take_moe_stats().begin()->second.routing_digest != first.routing_digest);
}

TEST_CASE("aux-loss-free balancing: the expert bias steers the choice, moves by the rate against the load, and is not trained") {
  Config c = tiny_decoder(true, 2);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 8;
  c.moe.moe_router_score_function = "sigmoid";
  c.moe.moe_router_enable_expert_bias = true;
  resolve(c, 1);
  GPTModel model(c, ProcessGroups::single());
  ParamStore& ps = model.params();
  const size_t bias = ps.index_of("layers.1.mlp.router.expert_bias");
  CHECK_FALSE(ps.info(bias).trainable);
  const Microbatch mb = tiny_batch();
  model.forward(mb, 1);
  model.backward(1.0f);
  CHECK(ps.grad(bias)[0] == 0.0f);  // outside the gradient
  const std::vector<double> counts = model.moe_stats().at(1).tokens;
  double mean = 0;
  for (double n : counts) mean += n / 4.0;
  model.update_expert_biases(0.25);
  bool moved = false;
  for (int e = 0; e < 4; ++e) {
    const double want = mean > counts[static_cast<size_t>(e)] ? 0.25 : mean < counts[static_cast<size_t>(e)] ? -0.25 : 0.0;
    CHECK(ps.param(bias)[e] == static_cast<float>(want));
    moved = moved || want != 0;
  }
  CHECK(moved);
  // A large bias on one expert makes every token choose it (the weights stay the unbiased sigmoid scores).
  (void)model.take_moe_stats();
  for (int e = 0; e < 4; ++e) ps.param(bias)[e] = e == 3 ? 100.0f : 0.0f;
  model.forward(mb, 1, true);
  CHECK(model.moe_stats().at(1).tokens[3] == 12.0);
}

TEST_CASE("quantile balancing: Megatron's qb_dual_update by hand, and qb_beta's update, steering and state") {
  // 4 tokens, 2 experts, top-1: each expert's target is 4 x 1 / 2 = 2 tokens, so its quantile is the 3rd largest of
  // logits - alpha, alpha each token's 2nd largest choice score (logits - beta).
  const std::vector<float> logits = {3, 1, 2, 0, 4, 1, 1, 0.5f};
  std::vector<float> choice(8), shifted(8), quantile(2);
  const std::vector<float> zero = {0, 0}, beta = {1, -1};
  quantile_choice_scores(logits.data(), zero.data(), 4, 2, 1, choice.data(), shifted.data());
  CHECK(choice == logits);
  CHECK(shifted == std::vector<float>{2, 0, 2, 0, 3, 0, 0.5f, 0});
  column_quantiles(shifted.data(), 4, 2, 1, quantile.data());
  CHECK(quantile == std::vector<float>{2, 0});
  quantile_choice_scores(logits.data(), beta.data(), 4, 2, 1, choice.data(), shifted.data());
  CHECK(choice == std::vector<float>{2, 2, 1, 1, 3, 2, 0, 1.5f});
  CHECK(shifted == std::vector<float>{1, -1, 1, -1, 2, -1, 1, 0.5f});  // (alpha 2, 1, 2, 0)
  column_quantiles(shifted.data(), 4, 2, 1, quantile.data());
  CHECK(quantile == std::vector<float>{1, -1});
  CHECK_THROWS(column_quantiles(shifted.data(), 3, 2, 1, quantile.data()));  // (3 choices over 2 experts)
  // Distinct values (8 tokens, 2 experts, top-1: the 5th largest of each column, Megatron's sort(descending)[m k / E]).
  const std::vector<float> columns = {8, -1, 3, -2, 6, -3, 1, -4, 7, -5, 2, -6, 5, -7, 4, -8};
  column_quantiles(columns.data(), 8, 2, 1, quantile.data());
  CHECK(quantile == std::vector<float>{4, -5});

  // The model: qb_beta a persistent [E] buffer outside the gradient; the update the quantiles' mean over the
  // iteration's microbatches, blended by the EMA and re-centred; evaluation neither updates nor accumulates.
  Config c = tiny_decoder(true, 2);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 8;
  c.moe.moe_layer_freq = "[0,1]";
  c.moe.moe_router_load_balancing_type = {"quantile_balancing"};
  resolve(c, 1);
  GPTModel model(c, ProcessGroups::single());
  ParamStore& ps = model.params();
  const size_t qb = ps.index_of("layers.1.mlp.router.qb_beta");
  CHECK_FALSE(ps.info(qb).trainable);
  const Microbatch mb = tiny_batch();
  ps.zero_grads();
  model.forward(mb, 1);
  model.forward(mb, 1);  // (two microbatches: their quantiles summed)
  model.backward(1.0f);
  CHECK(ps.grad(qb)[0] == 0.0f);
  const cpu::MoeLayerStats st = model.moe_stats().at(1);
  REQUIRE(st.quantile_count == 2);
  REQUIRE(st.quantile_sum.size() == 4);
  model.update_quantile_biases(0.0);
  double mean = 0;
  for (int e = 0; e < 4; ++e) mean += st.quantile_sum[static_cast<size_t>(e)] / 2.0 / 4.0;
  double spread = 0;
  for (int e = 0; e < 4; ++e) {
    CHECK(ps.param(qb)[e] == Approx(st.quantile_sum[static_cast<size_t>(e)] / 2.0 - mean).margin(1e-6));
    spread = std::max(spread, std::abs(static_cast<double>(ps.param(qb)[e])));
  }
  CHECK(spread > 0);
  // ema 0.75: three quarters of the bias kept, a quarter the new mean quantile, re-centred.
  const std::vector<float> before(ps.param(qb), ps.param(qb) + 4);
  model.update_quantile_biases(0.75);
  std::vector<double> blended(4);
  double centre = 0;
  for (int e = 0; e < 4; ++e) {
    blended[static_cast<size_t>(e)] = 0.75 * before[static_cast<size_t>(e)] + 0.25 * (st.quantile_sum[static_cast<size_t>(e)] / 2.0);
    centre += blended[static_cast<size_t>(e)] / 4.0;
  }
  for (int e = 0; e < 4; ++e) CHECK(ps.param(qb)[e] == Approx(blended[static_cast<size_t>(e)] - centre).margin(1e-6));
  // A bias far below one expert's makes every token choose it (the choice is logits - qb_beta), in training and in
  // evaluation.
  (void)model.take_moe_stats();
  for (int e = 0; e < 4; ++e) ps.param(qb)[e] = 0.0f;
  const float plain = model.forward(mb, 1, false);
  for (int e = 0; e < 4; ++e) ps.param(qb)[e] = e == 2 ? -100.0f : 0.0f;
  CHECK(model.forward(mb, 1, false) != plain);
  model.forward(mb, 1, true);
  CHECK(model.moe_stats().at(1).tokens[2] == 12.0);
  CHECK(model.moe_stats().at(1).quantile_count == 1);  // (the training forward's; the evaluations' none)
}

TEST_CASE("sinkhorn routing: Megatron's normalisation balances the choice in training; evaluation chooses by the scores") {
  // Megatron's sinkhorn: after the last round every expert's column sums to 1 / E and every token's row to about 1 / n.
  const int64_t n = 12, E = 4;
  std::vector<float> logits(static_cast<size_t>(n * E));
  fill_normal(logits, 3, 1.0f);
  for (int64_t t = 0; t < n; ++t) logits[static_cast<size_t>(t * E)] += 3.0f;  // every token prefers expert 0
  const std::vector<float> normalised = sinkhorn_normalize(logits.data(), n, E);
  for (int64_t e = 0; e < E; ++e) {
    double column = 0;
    for (int64_t t = 0; t < n; ++t) column += normalised[static_cast<size_t>(t * E + e)];
    CHECK(column == Approx(1.0 / E).epsilon(1e-4));
  }
  for (int64_t t = 0; t < n; ++t) {
    double row = 0;
    for (int64_t e = 0; e < E; ++e) row += normalised[static_cast<size_t>(t * E + e)];
    CHECK(row == Approx(1.0 / n).epsilon(1e-2));
  }
  // The top-1 choice: by the scores every token takes expert 0; by the normalised logits the experts share them.
  RouterSettings s{E, 1, ScoreFunction::kSigmoid, false, 1.0f, 0, 0};
  std::vector<int32_t> top(static_cast<size_t>(n));
  std::vector<float> weight(static_cast<size_t>(n));
  route_topk(s, logits.data(), nullptr, n, top.data(), weight.data());
  CHECK(std::count(top.begin(), top.end(), 0) == n);
  route_topk(s, logits.data(), nullptr, n, top.data(), weight.data(), normalised.data());
  std::vector<int64_t> per(static_cast<size_t>(E), 0);
  for (int32_t e : top) ++per[static_cast<size_t>(e)];
  CHECK(*std::max_element(per.begin(), per.end()) <= 5);
  // The weights stay sigmoid's of the chosen expert's logit.
  for (int64_t t = 0; t < n; ++t) {
    CHECK(weight[static_cast<size_t>(t)] == Approx(1.0 / (1.0 + std::exp(-static_cast<double>(logits[static_cast<size_t>(t * E + top[static_cast<size_t>(t)])])))));
  }
  // In the model (GPT: the router has a bias): a router that sends most tokens to expert 2. Training spreads them;
  // evaluation chooses by the scores, as the same model with sigmoid top-1 routing and no balancing does.
  Config c = tiny_moe_decoder(false);
  c.moe.moe_router_load_balancing_type = {"sinkhorn"};
  c.moe.moe_aux_loss_coeff = {0};
  c.moe.moe_router_topk = 1;
  resolve(c, 1);
  Config plain = c;
  plain.moe.moe_router_load_balancing_type = {"none"};
  plain.moe.moe_router_score_function = "sigmoid";
  resolve(plain, 1);
  GPTModel model(c, ProcessGroups::single()), reference(plain, ProcessGroups::single());
  ParamStore& ps = model.params();
  const size_t router = ps.index_of("layers.1.mlp.router.bias");
  for (int64_t e = 0; e < 4; ++e) ps.param(router)[e] = e == 2 ? 3.0f : 0.0f;
  std::copy(ps.params().f32(), ps.params().f32() + ps.numel(), reference.params().params().f32());
  const Microbatch mb = tiny_batch();
  const float trained = model.forward(mb, 1, true), trained_plain = reference.forward(mb, 1, true);
  const std::vector<double> tokens = model.take_moe_stats().at(1).tokens, tokens_plain = reference.take_moe_stats().at(1).tokens;
  INFO("tokens per expert: sinkhorn " << tokens[0] << " " << tokens[1] << " " << tokens[2] << " " << tokens[3] << ", by the scores " << tokens_plain[2]);
  CHECK(tokens_plain[2] >= 10.0);
  CHECK(*std::max_element(tokens.begin(), tokens.end()) <= 4.0);
  CHECK(trained != trained_plain);
  CHECK(model.forward(mb, 1, false) == reference.forward(mb, 1, false));
}

TEST_CASE("--moe-input-jitter-eps: the router's input times noise of the token's place; the experts' input unchanged") {
  // With a router that scores nothing (zero weights), jitter cannot change the choice or the weights: the loss is the
  // unjittered model's. With the router's weights, the logits (hence the loss) move, by no more than eps allows.
  Config c = tiny_moe_decoder(true);
  Config jittered = c;
  jittered.moe.moe_input_jitter_eps = 0.05;
  resolve(c, 1);
  resolve(jittered, 1);
  GPTModel plain(c, ProcessGroups::single()), noisy(jittered, ProcessGroups::single());
  const Microbatch mb = tiny_batch();
  const float a = plain.forward(mb, 1, false), b = noisy.forward(mb, 1, false);
  CHECK(a != b);
  CHECK(std::fabs(a - b) < 0.05 * std::fabs(a));
  ParamStore &p = plain.params(), &q = noisy.params();
  const size_t router = p.index_of("layers.1.mlp.router.weight");
  for (int64_t i = 0; i < p.info(router).numel; ++i) p.param(router)[i] = q.param(router)[i] = 0.0f;
  CHECK(plain.forward(mb, 1, false) == noisy.forward(mb, 1, false));
  // Out of (0, 1): refused.
  jittered.moe.moe_input_jitter_eps = 1.5;
  CHECK_FALSE(validate(jittered, 1, Purpose::kPrint).ok());
}

TEST_CASE("sinkhorn routing's rules: no aux loss, expert bias, groups or scaling (as Megatron's)") {
  Config c = tiny_moe_decoder(true);
  c.moe.moe_router_load_balancing_type = {"sinkhorn"};
  auto errors = [](const Config& k) {
    std::string all;
    for (const auto& e : validate(k, 1, Purpose::kPrint).errors) all += e + "\n";
    return all;
  };
  CHECK_THAT(errors(c), MT_CONTAINS("--moe-aux-loss-coeff 0"));
  c.moe.moe_aux_loss_coeff = {0};
  CHECK(errors(c).find("sinkhorn") == std::string::npos);
  c.moe.moe_router_topk_scaling_factor = 2.0;
  CHECK_THAT(errors(c), MT_CONTAINS("--moe-router-topk-scaling-factor does not apply to sinkhorn"));
}

TEST_CASE("--moe-apply-probs-on-input: top-1 only (Megatron's assertion), not with padding to capacity, nor with EP on the CUDA engine") {
  Config c = tiny_decoder(true, 2);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_apply_probs_on_input = true;
  auto errors = [](const Config& k) {
    std::string all;
    for (const auto& e : validate(k, 1, Purpose::kTrain).errors) all += e + "\n";
    return all;
  };
  CHECK_THAT(errors(c), MT_CONTAINS("--moe-apply-probs-on-input works only with --moe-router-topk 1"));
  c.moe.moe_router_topk = 1;
  CHECK_THAT(errors(c), !MT_CONTAINS("--moe-apply-probs-on-input"));
  auto refused = [](const Config& k, bool cuda) {
    std::string all;
    for (const auto& s : unsupported_features(k, 1, cuda)) all += s + "\n";
    return all;
  };
  CHECK(refused(c, false).empty());
  Config padded = c;
  padded.moe.moe_expert_capacity_factor = 1.0;
  padded.moe.moe_token_dispatcher_type = "alltoall";
  padded.moe.moe_pad_expert_input_to_capacity = true;
  CHECK_THAT(refused(padded, false), MT_CONTAINS("with --moe-pad-expert-input-to-capacity is not implemented"));
  if (built_with_cuda()) {  // (on one GPU since the thirtieth session; not with EP)
    auto gaps = [](const Config& k, int world) {
      std::string all;
      for (const auto& s : cuda_engine_gaps(k, world)) all += s + "\n";
      return all;
    };
    CHECK_THAT(gaps(c, 1), !MT_CONTAINS("--moe-apply-probs-on-input"));
    Config ep = c;
    ep.parallel.expert_model_parallel_size = 2;
    ep.training.use_distributed_optimizer = true;
    CHECK_THAT(gaps(ep, 2), MT_CONTAINS("--moe-apply-probs-on-input with expert parallelism is not implemented on the CUDA engine"));
  }
}

TEST_CASE("--recompute-modules moe_act: accepted by the CUDA engine beside the others, layernorm still refused by name") {
  Config c = tiny_decoder(true, 2);
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_grouped_gemm = true;
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"moe_act"};
  auto refused = [](const Config& k, bool cuda) {
    std::string all;
    for (const auto& s : unsupported_features(k, 1, cuda)) all += s + "\n";
    return all;
  };
  CHECK_THAT(refused(c, true), !MT_CONTAINS("moe_act"));
  // (the CPU engine keeps every activation: recompute of any kind is the CUDA engine's)
  CHECK_THAT(refused(c, false), MT_CONTAINS("activation recompute (--recompute-granularity) is implemented on the CUDA engine only"));
  c.recompute.recompute_modules = {"moe_act", "layernorm"};
  CHECK_THAT(refused(c, true), MT_CONTAINS("--recompute-modules layernorm is not implemented (selective recompute covers core_attn, mlp, moe, moe_act and mla_up_proj)"));
  c.recompute.recompute_modules = {"moe", "shared_experts"};
  CHECK_THAT(refused(c, true), !MT_CONTAINS("shared_experts"));
  c.recompute.recompute_modules = {"shared_experts"};
  CHECK_THAT(refused(c, true), MT_CONTAINS("--recompute-modules shared_experts is not implemented"));
  if (built_with_cuda()) {  // (ran on a GPU in the thirty-eighth session)
    c.recompute.recompute_modules = {"moe_act"};
    std::string gaps;
    for (const auto& s : cuda_engine_gaps(c, 1)) gaps += s + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("moe_act"));
  }
}
