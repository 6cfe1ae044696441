// test_megatron_flags.cpp: Megatron flags with semantics of their own on the CPU engine. --apply-layernorm-1p: a
// model whose norms scale by 1 + w computes what the plain model with weights 1 + w computes (loss and every
// gradient), and its norm weights start at 0; --decoupled-lr: the word embeddings and the output layer move at their
// own rate (frozen at 0, identical when equal to --lr), on the same schedule; --use-rope-scaling: LLaMA 3.1's
// frequencies by hand, and the CPU RoPE rotating by them; --rotary-seq-len-interpolation-factor: the positions divided.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "catch.h"
#include "config/cli.h"
#include "config/resolve.h"
#include "kernels/cpu/rope.h"
#include "kernels/rope_frequencies.h"
#ifdef MEGATRAIN_HAVE_CUDA
#include "kernels/cuda/rope.h"
#endif
#include "config/validate.h"
#include "config/yaml_io.h"
#include "model/gpt_model.h"
#include "model/model_dims.h"
#include "optim/lr_schedule.h"
#include "tiny_models.h"
#include "train/trainer.h"

using namespace mt;

namespace {

bool is_norm_weight(const std::string& name) { return name.find("norm.weight") != std::string::npos; }

}  // namespace

TEST_CASE("--apply-layernorm-1p: norms scale by 1 + weight, the weights start at 0") {
  for (bool llama : {false, true}) {
    Config plain = test::tiny_decoder(llama, 2, 0.0, llama);  // (LLaMA with --qk-layernorm: its head norms too)
    Config one_p = plain;
    one_p.model.apply_layernorm_1p = true;
    GPTModel a(one_p, ProcessGroups::single()), b(plain, ProcessGroups::single());
    ParamStore &pa = a.params(), &pb = b.params();
    REQUIRE(pa.size() == pb.size());
    int norms = 0;
    for (size_t i = 0; i < pa.size(); ++i) {
      const ParamInfo& p = pa.info(i);
      if (!is_norm_weight(p.name)) continue;
      ++norms;
      for (int64_t e = 0; e < p.numel; ++e) CHECK(pa.param(i)[e] == 0.0f);  // zero-centred at the start
      for (int64_t e = 0; e < p.numel; ++e) {  // then both models hold the same scales: 1 + w and w
        pa.param(i)[e] = 0.03f * static_cast<float>((e * 7 + static_cast<int64_t>(i)) % 11) - 0.15f;
        pb.param(i)[e] = 1.0f + pa.param(i)[e];
      }
    }
    CHECK(norms == (llama ? 2 * 4 + 1 : 2 * 2 + 1));
    for (GPTModel* m : {&a, &b}) {
      m->params().zero_grads();
      m->forward(test::tiny_batch(), 1, true);
      m->backward(1.0f, true);
    }
    CHECK(a.forward(test::tiny_batch(), 1, false) == Approx(b.forward(test::tiny_batch(), 1, false)).epsilon(1e-6));
    for (size_t i = 0; i < pa.size(); ++i) {
      const ParamInfo& p = pa.info(i);
      INFO(p.name);
      double diff = 0, scale = 1e-12;
      for (int64_t e = 0; e < p.numel; ++e) {
        diff = std::max(diff, static_cast<double>(std::fabs(pa.grad(i)[e] - pb.grad(i)[e])));
        scale = std::max(scale, static_cast<double>(std::fabs(pb.grad(i)[e])));
      }
      CHECK(diff / scale < 1e-5);  // (the norm weights' gradients too: d(1 + w) / dw = 1)
    }
  }
}

TEST_CASE("--decoupled-lr: the word embeddings and the output layer on their own rate") {
  auto config = [](std::optional<double> decoupled, std::optional<double> decoupled_min, int64_t iters = 3) {
    Config c;
    apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
    c.data.text_data_path = std::string(MEGATRAIN_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt";
    c.training.train_iters = iters;
    c.training.lr_warmup_iters = 1;
    c.logging.eval_interval = 1000;
    c.logging.eval_iters = 0;
    c.training.decoupled_lr = decoupled;
    c.training.decoupled_min_lr = decoupled_min;
    REQUIRE(validate(c, 1, Purpose::kTrain).ok());
    resolve(c, 1, 257);
    return c;
  };
  const Config base_cfg = config(std::nullopt, std::nullopt);
  const TrainResult base = train(base_cfg, ProcessGroups::single(), {true, 0});
  const TrainResult same = train(config(*base_cfg.training.lr, std::nullopt), ProcessGroups::single(), {true, 0});
  const TrainResult frozen = train(config(0.0, 0.0), ProcessGroups::single(), {true, 0});  // (the final rate would default to --min-lr)
  const TrainResult frozen_early = train(config(0.0, 0.0, 1), ProcessGroups::single(), {true, 0});  // after one step
  ParamStore &pb = base.model->params(), &ps = same.model->params(), &pf = frozen.model->params(), &pi = frozen_early.model->params();
  int decoupled = 0;
  for (size_t i = 0; i < pb.size(); ++i) {
    const ParamInfo& p = pb.info(i);
    INFO(p.name);
    const std::vector<float> vb(pb.param(i), pb.param(i) + p.numel), vs(ps.param(i), ps.param(i) + p.numel);
    CHECK(vb == vs);  // --decoupled-lr equal to --lr changes nothing
    const bool own_rate = p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    decoupled += own_rate;
    const std::vector<float> vf(pf.param(i), pf.param(i) + p.numel), v0(pi.param(i), pi.param(i) + p.numel);
    if (own_rate) CHECK(vf == v0);  // at rate 0 they never move
    else CHECK(vf != v0);
  }
  CHECK(decoupled == 2);  // (the quickstart's output layer is untied)
  // The schedule: the same warmup and decay between --decoupled-lr and --decoupled-min-lr (or --min-lr).
  Config c = config(1e-2, 1e-3);
  c.training.lr = 1e-3;
  c.training.min_lr = 1e-4;
  const LrSchedule main(c), own(c, true);
  const int64_t gbs = c.derived.global_batch_size;
  for (int64_t it : {0, 1, 2, 3}) CHECK(own.lr_at_samples(it * gbs) == Approx(10.0 * main.lr_at_samples(it * gbs)).epsilon(1e-9));
  Config missing = config(std::nullopt, std::nullopt);
  missing.training.decoupled_min_lr = 1e-4;
  CHECK_FALSE(validate(missing, 1, Purpose::kTrain).ok());
}

TEST_CASE("--use-rope-scaling: LLaMA 3.1's frequencies, and RoPE rotating by them") {
  const int64_t rot = 128;
  const double base = 500000.0;
  const std::vector<double> plain = rope_inverse_frequencies(rot, base, {});
  const std::vector<double> scaled = rope_inverse_frequencies(rot, base, RopeScaling{.factor = 8.0});
  REQUIRE(plain.size() == 64);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelength = 2.0 * 3.141592653589793 / plain[i];
    INFO("i " << i << " wavelength " << wavelength);
    CHECK(plain[i] == std::pow(base, -2.0 * static_cast<double>(i) / 128.0));
    if (wavelength < 8192.0 / 4) {  // short wavelengths: kept
      CHECK(scaled[i] == plain[i]);
      ++kept;
    } else if (wavelength > 8192.0) {  // long ones: slowed 8 times
      CHECK(scaled[i] == Approx(plain[i] / 8).epsilon(1e-15));
      ++divided;
    } else {  // between: (1 - s) f / 8 + s f with s = (8192 / wavelength - 1) / 3
      const double smooth = (8192.0 / wavelength - 1.0) / 3.0;
      CHECK(scaled[i] == Approx((1.0 - smooth) * plain[i] / 8 + smooth * plain[i]).epsilon(1e-15));
      CHECK(scaled[i] < plain[i]);
      CHECK(scaled[i] > plain[i] / 8);
      ++blended;
    }
  }
  CHECK(kept > 0);
  CHECK(divided > 0);
  CHECK(blended > 0);
  // The CPU RoPE with the scaling rotates channel pair i by position x scaled[i].
  const int64_t T = 3, H = 1, d = rot;
  std::vector<float> x(static_cast<size_t>(T * H * d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  const std::vector<int32_t> pos = {0, 5000, 30000};
  std::vector<float> y = x;
  cpu::rope_forward(y.data(), pos.data(), T, H, d, rot, static_cast<float>(base), false, RopeScaling{.factor = 8.0});
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double ang = static_cast<double>(pos[static_cast<size_t>(t)]) * scaled[static_cast<size_t>(i)];
      const float c = static_cast<float>(std::cos(ang)), s = static_cast<float>(std::sin(ang));
      const float x1 = x[static_cast<size_t>(t * d + i)], x2 = x[static_cast<size_t>(t * d + i + rot / 2)];
      CHECK(y[static_cast<size_t>(t * d + i)] == x1 * c - x2 * s);
      CHECK(y[static_cast<size_t>(t * d + i + rot / 2)] == x2 * c + x1 * s);
    }
  }
  cpu::rope_backward(y.data(), pos.data(), T, H, d, rot, static_cast<float>(base), false, RopeScaling{.factor = 8.0});
  for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == Approx(x[i]).margin(1e-6));
#ifdef MEGATRAIN_HAVE_CUDA
  // The CUDA engine's table (host code): cos and sin of position x the same scaled frequencies.
  const std::vector<float> table = cuda::rope_table(40000, rot, base, RopeScaling{.factor = 8.0});
  for (int32_t p : pos) {
    for (int64_t i = 0; i < rot / 2; ++i) {
      const double ang = static_cast<double>(p) * scaled[static_cast<size_t>(i)];
      CHECK(table[static_cast<size_t>((p * rot / 2 + i) * 2)] == static_cast<float>(std::cos(ang)));
      CHECK(table[static_cast<size_t>((p * rot / 2 + i) * 2 + 1)] == static_cast<float>(std::sin(ang)));
    }
  }
#endif
}

TEST_CASE("--position-embedding-type yarn: YaRN's frequencies and attention factor (HuggingFace's and Megatron's formula)") {
  // Expected values from HuggingFace's _compute_yarn_parameters, evaluated independently (in Python): GPT-OSS's settings
  // (head 64, base 150000, factor 32, original 4096 positions, beta 32 / 1, the range's ends not rounded), and a second
  // set with the ends rounded and Megatron's mscale / mscale_all_dim 1 / 0.
  const RopeScaling gpt_oss{.yarn_factor = 32, .yarn_original_max_positions = 4096, .yarn_beta_fast = 32, .yarn_beta_slow = 1,
                            .yarn_round_to_int = false};
  const std::vector<double> f = rope_inverse_frequencies(64, 150000.0, gpt_oss);
  REQUIRE(f.size() == 32);
  const std::vector<std::pair<size_t, double>> want = {{0, 1.0}, {5, 0.15532298948448497}, {8, 0.050813274815461475}, {12, 0.0067949594897322189},
                                                       {20, 1.818833668168956e-05}, {31, 3.0235114281192144e-07}};
  for (auto [i, v] : want) CHECK(f[i] == Approx(v).epsilon(1e-12));
  CHECK(rope_attention_factor(gpt_oss) == Approx(1.3465735902799727).epsilon(1e-12));
  const RopeScaling rounded{.yarn_factor = 4, .yarn_original_max_positions = 2048};
  const std::vector<double> g = rope_inverse_frequencies(64, 10000.0, rounded);
  const std::vector<std::pair<size_t, double>> want_rounded = {{0, 1.0}, {5, 0.23713737056616555}, {8, 0.1}, {12, 0.024325212770525993},
                                                               {20, 0.00097300851082103958}, {31, 3.3338035804083099e-05}};
  for (auto [i, v] : want_rounded) CHECK(g[i] == Approx(v).epsilon(1e-12));
  CHECK(rope_attention_factor(rounded) == Approx(1.138629436111989).epsilon(1e-12));
  CHECK(rope_attention_factor(RopeScaling{.yarn_factor = 4, .yarn_mscale = 1, .yarn_mscale_all_dim = 1}) == 1.0);  // (DeepSeek's ratio)
  CHECK(rope_attention_factor({}) == 1.0);
  // The CPU RoPE scales the rotation by the factor, and its backward is the transpose: <R x, y> = <x, R^T y>.
  const int64_t T = 3, H = 2, d = 64;
  std::vector<float> x(static_cast<size_t>(T * H * d)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.02f * static_cast<float>(i % 13) - 0.1f, y[i] = 0.03f * static_cast<float>(i % 7) - 0.08f;
  const std::vector<int32_t> pos = {0, 7, 3000};
  std::vector<float> rx = x, rty = y;
  cpu::rope_forward(rx.data(), pos.data(), T, H, d, d, 150000.0f, false, gpt_oss);
  cpu::rope_backward(rty.data(), pos.data(), T, H, d, d, 150000.0f, false, gpt_oss);
  double lhs = 0, rhs = 0, norm_x = 0, norm_rx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    lhs += static_cast<double>(rx[i]) * y[i];
    rhs += static_cast<double>(x[i]) * rty[i];
    norm_x += static_cast<double>(x[i]) * x[i];
    norm_rx += static_cast<double>(rx[i]) * rx[i];
  }
  CHECK(lhs == Approx(rhs).epsilon(1e-5));
  CHECK(std::sqrt(norm_rx / norm_x) == Approx(1.3465735902799727).epsilon(1e-5));
#ifdef MEGATRAIN_HAVE_CUDA
  // The CUDA engine's table carries the factor too.
  const std::vector<float> table = cuda::rope_table(4000, d, 150000.0, gpt_oss);
  for (int32_t p : pos) {
    for (int64_t i = 0; i < d / 2; ++i) {
      const double ang = static_cast<double>(p) * f[static_cast<size_t>(i)];
      CHECK(table[static_cast<size_t>((p * d / 2 + i) * 2)] == Approx(1.3465735902799727 * std::cos(ang)).margin(1e-6));
      CHECK(table[static_cast<size_t>((p * d / 2 + i) * 2 + 1)] == Approx(1.3465735902799727 * std::sin(ang)).margin(1e-6));
    }
  }
#endif
}

TEST_CASE("--position-embedding-type yarn: the flags reach the model, Megatron's defaults, and what it refuses") {
  CLI::App app;
  ConfigCli cli(app);
  app.parse("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 1 "
            "--train-iters 1 --lr 1e-3 --mock-data --vocab-size 64 --normalization RMSNorm --position-embedding-type yarn "
            "--rotary-scaling-factor 32 --yarn-original-max-position-embeddings 4096 --no-yarn-correction-range-round-to-int",
            false);
  Config c = cli.build();
  CHECK(validate(c, 1, Purpose::kTrain).ok());
  resolve(c, 1);
  const ModelDims D = model_dims(c, 0, 1);
  CHECK(D.rope);
  CHECK(D.rope_scaling.yarn_factor == 32);
  CHECK(D.rope_scaling.yarn_original_max_positions == 4096);
  CHECK(D.rope_scaling.yarn_beta_fast == 32);  // (Megatron's defaults)
  CHECK(D.rope_scaling.yarn_beta_slow == 1);
  CHECK_FALSE(D.rope_scaling.yarn_round_to_int);
  Config partial = c;
  partial.model.rotary_percent = 0.5;
  CHECK_FALSE(validate(partial, 1, Purpose::kTrain).ok());
  Config interleaved = c;
  interleaved.model.rotary_interleaved = true;
  CHECK_FALSE(validate(interleaved, 1, Purpose::kTrain).ok());
  Config zero = c;
  zero.model.rotary_scaling_factor = 0;
  CHECK_FALSE(validate(zero, 1, Purpose::kTrain).ok());
}

TEST_CASE("--rotary-seq-len-interpolation-factor: every position divided by the factor (Megatron's, HF's linear rope type)") {
  const int64_t rot = 64;
  const double base = 10000.0;
  const std::vector<double> plain = rope_inverse_frequencies(rot, base, {});
  const std::vector<double> interpolated = rope_inverse_frequencies(rot, base, RopeScaling{.position_interpolation = 4});
  REQUIRE(interpolated.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(interpolated[i] == plain[i] / 4);
  // With LLaMA 3.1's scaling too: its bands chosen from the frequencies before the interpolation (Megatron scales
  // inv_freq, then divides the positions), so a wavelength the interpolation would carry into another band keeps its own.
  const std::vector<double> llama3 = rope_inverse_frequencies(rot, 500000.0, RopeScaling{.factor = 8.0});
  const std::vector<double> both = rope_inverse_frequencies(rot, 500000.0, RopeScaling{.factor = 8.0, .position_interpolation = 4});
  for (size_t i = 0; i < llama3.size(); ++i) CHECK(both[i] == llama3[i] / 4);
  // The CPU RoPE at position 4p with the factor rotates as at position p without it (the same angles, bit for bit).
  const int64_t T = 3, H = 2, d = rot;
  std::vector<float> x(static_cast<size_t>(T * H * d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.02f * static_cast<float>(i % 13) - 0.1f;
  const std::vector<int32_t> far = {0, 12, 4000}, near = {0, 3, 1000};
  std::vector<float> a = x, b = x;
  cpu::rope_forward(a.data(), far.data(), T, H, d, rot, static_cast<float>(base), false, RopeScaling{.position_interpolation = 4});
  cpu::rope_forward(b.data(), near.data(), T, H, d, rot, static_cast<float>(base));
  CHECK(a == b);
  std::vector<float> moved = x;
  cpu::rope_forward(moved.data(), far.data(), T, H, d, rot, static_cast<float>(base));
  CHECK(moved != a);  // (without the factor the same positions rotate otherwise)
#ifdef MEGATRAIN_HAVE_CUDA
  // The CUDA engine's table (host code): row 4p with the factor is row p without it.
  const std::vector<float> with = cuda::rope_table(4096, rot, base, RopeScaling{.position_interpolation = 4}), without = cuda::rope_table(1024, rot, base);
  for (int64_t p : {0, 1, 3, 1000}) {
    for (int64_t i = 0; i < rot; ++i) CHECK(with[static_cast<size_t>(4 * p * rot + i)] == without[static_cast<size_t>(p * rot + i)]);
  }
#endif
  // The flag reaches the model: LLaMA with factor 2 at positions 0, 2, 4, ... computes what it computes without the
  // factor at positions 0, 1, 2, ...
  Config plain_model = test::tiny_decoder(true, 2, 0.0, false);
  Config factor_two = plain_model;
  factor_two.model.rotary_seq_len_interpolation_factor = 2;
  CHECK(model_dims(factor_two, 0, 1).rope_scaling.position_interpolation == 2.0);
  CHECK(model_dims(plain_model, 0, 1).rope_scaling.position_interpolation == 1.0);
  GPTModel with_factor(factor_two, ProcessGroups::single()), without_factor(plain_model, ProcessGroups::single());
  Microbatch spread = test::tiny_batch();
  for (int32_t& p : spread.positions) p *= 2;
  const double loss_with = with_factor.forward(spread, 1, false), loss_without = without_factor.forward(test::tiny_batch(), 1, false);
  CHECK(loss_with == loss_without);
  CHECK(without_factor.forward(spread, 1, false) != loss_without);
  // Validation: a whole number >= 1, with RoPE.
  auto complaints = [](const Config& c) {
    int n = 0;
    for (const std::string& e : validate(c, 1, Purpose::kTrain).errors) n += e.find("--rotary-seq-len-interpolation-factor") != std::string::npos ? 1 : 0;
    return n;
  };
  Config zero = plain_model;
  zero.model.rotary_seq_len_interpolation_factor = 0;
  CHECK(complaints(zero) == 1);
  Config learned = test::tiny_decoder(false, 2, 0.0, false);
  learned.model.rotary_seq_len_interpolation_factor = 2;
  CHECK(complaints(learned) == 1);
  CHECK(complaints(factor_two) == 0);
}

TEST_CASE("--apply-wd-to-qk-layernorm: the QK norms' weights decay (Megatron's Qwen3-Next rule), other norms do not") {
  for (bool apply : {false, true}) {
    Config c = test::tiny_decoder(true, 2, 0.0, true);
    c.training.apply_wd_to_qk_layernorm = apply;
    GPTModel model(c, ProcessGroups::single());
    int qk = 0;
    for (size_t i = 0; i < model.params().size(); ++i) {
      const ParamInfo& p = model.params().info(i);
      const bool qk_norm = p.name.find("q_norm.") != std::string::npos || p.name.find("k_norm.") != std::string::npos;
      INFO(p.name);
      if (qk_norm) {
        ++qk;
        CHECK(p.weight_decay == apply);
      } else {
        CHECK(p.weight_decay == (p.global_shape.size() > 1));
      }
    }
    CHECK(qk == 4);
  }
  // Megatron's deprecated spelling.
  Config c;
  apply_yaml_text(c, "no_weight_decay_cond_type: apply_wd_to_qk_layernorm\n", "a recipe");
  CHECK(c.training.apply_wd_to_qk_layernorm);
}
