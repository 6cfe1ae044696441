// test_precision_aware_optimizer.cpp: Megatron's precision-aware optimizer (--use-precision-aware-optimizer with
// --exp-avg-dtype / --exp-avg-sq-dtype bf16): Adam computed in fp32 from the stored moments, the update from the moments
// before rounding, each moment then stored rounded to nearest even (Transformer Engine's FusedAdam); against that
// update in double over several steps, on the CPU engine's optimizer and the offloaded one's host update; the flags'
// rules (Megatron's, and the storage types megatrain refuses by name); a checkpoint's moments rounded at the load.
#include <CLI/CLI.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "catch.h"
#include "config/cli.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "model/params.h"
#include "optim/host_adam.h"
#include "optim/optimizer.h"
#include "plan/memory_model.h"
#include "tensor/dtype.h"

using namespace mt;

namespace {

Config parse_line(const std::string& line) {
  CLI::App app;
  ConfigCli cli(app);
  app.parse(line, false);
  return cli.build();
}

std::string errors_of(const std::string& flags) {
  Config c = parse_line(
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 "
      "--train-iters 2 --lr 1e-3 --mock-data " +
      flags);
  const Diagnostics d = validate(c, 1, Purpose::kTrain);
  std::string all;
  for (const auto& e : d.errors) all.append(e).append("\n");
  for (const auto& w : d.warnings) all.append("warning: ").append(w).append("\n");
  return all;
}

// The reference: the moments in fp32 from the stored ones (Transformer Engine's kernel computes in fp32), the weights'
// update from them unrounded in double, then each moment stored rounded to nearest even where it is bf16.
struct Reference {
  std::vector<double> w;
  std::vector<float> m, v;
  bool m_bf16, v_bf16;
  void step(const std::vector<float>& g, int t, float lr, float b1, float b2, float eps, float decay) {
    for (size_t k = 0; k < w.size(); ++k) {
      const float mk = b1 * m[k] + (1.0f - b1) * g[k], vk = b2 * v[k] + (1.0f - b2) * g[k] * g[k];
      w[k] -= double{lr} * ((mk / (1 - std::pow(double{b1}, t))) / (std::sqrt(vk / (1 - std::pow(double{b2}, t))) + eps) + decay * w[k]);
      m[k] = m_bf16 ? round_bf16(mk) : mk;
      v[k] = v_bf16 ? round_bf16(vk) : vk;
    }
  }
};

}  // namespace

TEST_CASE("precision-aware optimizer: the flags' rules, Megatron's and the storage types not implemented") {
  const std::string aware = "--use-distributed-optimizer --use-precision-aware-optimizer ";
  CHECK(errors_of(aware + "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16").empty());
  CHECK(errors_of(aware + "--main-grads-dtype fp32 --main-params-dtype fp32").empty());
  CHECK_THAT(errors_of("--exp-avg-dtype bf16"), MT_CONTAINS("--exp-avg-dtype bf16 needs --use-precision-aware-optimizer"));
  CHECK_THAT(errors_of("--use-distributed-optimizer --exp-avg-sq-dtype bf16"),
             MT_CONTAINS("--exp-avg-sq-dtype bf16 needs --use-precision-aware-optimizer"));
  CHECK_THAT(errors_of("--use-precision-aware-optimizer"),
             MT_CONTAINS("--use-precision-aware-optimizer needs --use-distributed-optimizer"));
  CHECK_THAT(errors_of(aware + "--optimizer sgd"), MT_CONTAINS("--optimizer adam only"));
  CHECK_THAT(errors_of(aware + "--main-grads-dtype bf16"), MT_CONTAINS("--main-grads-dtype bf16: gradients kept in bf16 not implemented"));
  CHECK_THAT(errors_of(aware + "--main-params-dtype fp16"), MT_CONTAINS("--main-params-dtype fp16: fp16 master weights not implemented"));
  CHECK_THAT(errors_of(aware + "--exp-avg-dtype fp16"), MT_CONTAINS("--exp-avg-dtype fp16: Adam's moments in fp16"));
  CHECK_THAT(errors_of(aware + "--exp-avg-sq-dtype fp8"), MT_CONTAINS("(fp32 or bf16 only)"));
  // (a type not implemented says so first, with or without the flag)
  CHECK_THAT(errors_of("--use-distributed-optimizer --main-grads-dtype bf16"), !MT_CONTAINS("needs --use-precision-aware-optimizer"));
  // Megatron's offload (its hybrid optimizer, which requires the flag) keeps fp32 moments whatever the types say
  CHECK_THAT(errors_of(aware + "--exp-avg-dtype bf16 --optimizer-cpu-offload"),
             MT_CONTAINS("warning: --exp-avg-dtype bf16 with --optimizer-cpu-offload: Megatron's hybrid CPU/GPU optimizer keeps"));
  // A type Megatron does not have is the flag parser's error
  CHECK_THROWS(parse_line("--exp-avg-dtype int8"));
  // The plan counts the moments at 2 bytes each
  Config plain = parse_line(
      "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 "
      "--train-iters 2 --lr 1e-3 --mock-data --bf16 --vocab-size 128 --use-distributed-optimizer");
  Config halved = plain;
  halved.training.use_precision_aware_optimizer = true;
  halved.training.exp_avg_dtype = halved.training.exp_avg_sq_dtype = "bf16";
  resolve(plain, 1);
  resolve(halved, 1);
  const MemoryEstimate a = estimate_memory_for_stage(plain, 0), b = estimate_memory_for_stage(halved, 0);
  CHECK(b.optimizer == Approx(a.optimizer * 8.0 / 12.0));  // 4 + 4 + 4 bytes -> 4 + 2 + 2
  halved.training.optimizer_cpu_offload = true;
  halved.training.optimizer_offload_fraction = 0.5;
  plain.training.optimizer_cpu_offload = true;
  plain.training.optimizer_offload_fraction = 0.5;
  CHECK(estimate_memory_for_stage(halved, 0).optimizer == Approx(estimate_memory_for_stage(plain, 0).optimizer));
}

TEST_CASE("precision-aware optimizer: bf16 moments, the update from the unrounded ones, five steps against double") {
  for (const auto& [m_bf16, v_bf16] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
    Config c;
    c.training.weight_decay = 0.1;
    c.training.clip_grad = 0;
    c.training.adam_beta2 = 0.95;
    c.training.use_distributed_optimizer = c.training.use_precision_aware_optimizer = true;
    // (both in bf16 but offloaded: Megatron's hybrid optimizer keeps them in fp32)
    const bool offloaded = !m_bf16 && !v_bf16;
    c.training.exp_avg_dtype = m_bf16 || offloaded ? "bf16" : "fp32";
    c.training.exp_avg_sq_dtype = v_bf16 || offloaded ? "bf16" : "fp32";
    c.training.optimizer_cpu_offload = offloaded;
    auto make_store = [](ParamStore& ps) {
      ParamInfo p;
      p.name = "w";
      p.local_shape = p.global_shape = {64, 8};
      p.init = InitKind::kNormal;
      p.weight_decay = true;
      ps.add(p);
      ps.allocate();
      ps.initialize(3);
    };
    ParamStore ps, ps32;
    make_store(ps);
    make_store(ps32);
    const int64_t n = ps.numel();
    Reference ref{std::vector<double>(ps.params().f32(), ps.params().f32() + n), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f), m_bf16, v_bf16};
    Optimizer opt(c, ps, ProcessGroups::single());
    Config fp32_state = c;
    fp32_state.training.exp_avg_dtype = fp32_state.training.exp_avg_sq_dtype = "fp32";
    Optimizer opt32(fp32_state, ps32, ProcessGroups::single());
    // The offloaded optimizer's host update on its own arrays
    std::vector<float> hw(ps.params().f32(), ps.params().f32() + n), hm(n, 0.0f), hv(n, 0.0f);
    std::vector<uint16_t> h16(n);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    for (int t = 1; t <= 5; ++t) {
      std::vector<float> g(static_cast<size_t>(n));
      for (auto& x : g) x = dist(rng);
      std::copy(g.begin(), g.end(), ps.grads().f32());
      std::copy(g.begin(), g.end(), ps32.grads().f32());
      opt.step(1e-2, 1.0f);
      opt32.step(1e-2, 1.0f);
      HostAdamStep s;
      s.lr = 1e-2f;
      s.beta1 = 0.9f;
      s.beta2 = 0.95f;
      s.eps = 1e-8f;
      s.weight_decay = 0.1f;
      s.bc1 = static_cast<float>(1.0 - std::pow(0.9, t));
      s.bc2 = static_cast<float>(1.0 - std::pow(0.95, t));
      s.exp_avg_bf16 = m_bf16;
      s.exp_avg_sq_bf16 = v_bf16;
      host_adamw(hw.data(), hm.data(), hv.data(), g.data(), h16.data(), n, true, s);
      ref.step(g, t, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f);
    }
    double worst_w = 0, worst_host = 0, moved = 0;
    int64_t off_bf16 = 0, moment_gap = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      worst_w = std::max(worst_w, std::fabs(ps.params().f32()[i] - ref.w[k]));
      worst_host = std::max(worst_host, std::fabs(hw[k] - ref.w[k]));
      moved = std::max(moved, std::fabs(static_cast<double>(ps.params().f32()[i]) - ps32.params().f32()[i]));
      for (const float x : {opt.exp_avg()[i], hm[k]}) off_bf16 += m_bf16 && round_bf16(x) != x;
      for (const float x : {opt.exp_avg_sq()[i], hv[k]}) off_bf16 += v_bf16 && round_bf16(x) != x;
      // the stored moments the reference's (the same fp32 operations, within one bf16 step where a compiler's fused
      // multiply-add moves the last bit across a rounding boundary)
      if (std::fabs(opt.exp_avg()[i] - ref.m[k]) > 8e-3 * std::fabs(ref.m[k])) ++moment_gap;
      if (std::fabs(opt.exp_avg_sq()[i] - ref.v[k]) > 8e-3 * std::fabs(ref.v[k])) ++moment_gap;
    }
    INFO("moments " << c.training.exp_avg_dtype << " / " << c.training.exp_avg_sq_dtype);
    CHECK(off_bf16 == 0);
    CHECK(moment_gap == 0);
    CHECK(worst_w < 2e-6);  // (the weights' fp32 arithmetic against double; the rounding of the moments is the reference's)
    CHECK(worst_host < 2e-6);
    if (offloaded) CHECK(moved == 0.0);  // fp32 moments: the plain optimizer's weights to the bit
    else CHECK(moved > 1e-6);            // the stored moments' rounding changed the weights against fp32 moments
  }
}

TEST_CASE("precision-aware optimizer: moments loaded from fp32 are stored as bf16") {
  Config c;
  c.training.use_distributed_optimizer = c.training.use_precision_aware_optimizer = true;
  c.training.exp_avg_sq_dtype = "bf16";
  ParamStore ps;
  ParamInfo p;
  p.name = "w";
  p.local_shape = p.global_shape = {16};
  p.init = InitKind::kOnes;
  ps.add(p);
  ps.allocate();
  ps.initialize(1);
  Optimizer opt(c, ps, ProcessGroups::single());
  for (int64_t i = 0; i < 16; ++i) opt.exp_avg()[i] = opt.exp_avg_sq()[i] = 1.0f + 1e-4f * static_cast<float>(i + 1);
  opt.round_stored_moments();
  for (int64_t i = 0; i < 16; ++i) {
    CHECK(opt.exp_avg()[i] == 1.0f + 1e-4f * static_cast<float>(i + 1));  // fp32: unchanged
    CHECK(opt.exp_avg_sq()[i] == round_bf16(1.0f + 1e-4f * static_cast<float>(i + 1)));
  }
}
