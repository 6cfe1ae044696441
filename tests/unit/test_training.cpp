// test_training.cpp: the reference engine trains: tinyshakespeare bytes beat the unigram entropy,
// runs are bit-identical, mock data is learnable, schedules and scalers follow Megatron.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "config/batch_steps.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/yaml_io.h"
#include "data/mock_dataset.h"
#include "fake_groups.h"
#include "model/gpt_model.h"
#include "optim/batch_schedule.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "tensor/dtype.h"
#include "tensor/device_info.h"
#include "train/capabilities.h"
#include "train/log_line.h"
#include "train/replica_check.h"
#include "train/trainer.h"

using namespace mt;

namespace {

const std::string kShakespeare = std::string(MEGATRAIN_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt";

// A tiny GPT (hidden 32, 4 heads, micro batch 4) on mock data, before resolve().
Config tiny_mock_gpt(int64_t layers, int64_t seq, int64_t vocab) {
  Config c;
  c.model.num_layers = layers;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = seq;
  c.model.vocab_size = vocab;
  c.data.seq_length = seq;
  c.data.mock_data = true;
  c.training.micro_batch_size = 4;
  return c;
}

Config tiny_llama_on_shakespeare(int64_t iters) {
  Config c;
  apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
  c.data.text_data_path = kShakespeare;
  c.training.train_iters = iters;
  c.logging.eval_interval = iters;
  c.logging.eval_iters = 4;
  REQUIRE(validate(c, 1, Purpose::kTrain).ok());
  resolve(c, 1, 257);
  return c;
}

double unigram_entropy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<int, double> count;
  for (auto b : bytes) count[b] += 1;
  double h = 0;
  for (auto& [k, v] : count) h -= v / static_cast<double>(bytes.size()) * std::log(v / static_cast<double>(bytes.size()));
  return h;
}

}  // namespace

TEST_CASE("a tiny LLaMA on tinyshakespeare bytes beats the unigram entropy; same seed, identical losses") {
  const double h1 = unigram_entropy(kShakespeare);
  CHECK(h1 == Approx(3.3128).epsilon(1e-3));
  const Config c = tiny_llama_on_shakespeare(60);
  const TrainResult a = train(c, ProcessGroups::single(), {true, 0});
  REQUIRE(a.valid_losses.size() == 2);  // (at iteration 60, and after the last iteration on the next batches)
  INFO("validation loss " << a.valid_losses.back() << " vs unigram entropy " << h1);
  CHECK(a.losses.front() > 5.0);                 // starts near ln(257) = 5.55
  CHECK(a.valid_losses.back() < h1 - 0.5);       // a clear margin below a unigram model
  const TrainResult b = train(c, ProcessGroups::single(), {true, 0});
  REQUIRE(a.losses.size() == b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) CHECK(a.losses[i] == b.losses[i]);  // bit-identical
  Config other = c;
  other.training.seed = 4321;
  const TrainResult d = train(other, ProcessGroups::single(), {true, 0});
  CHECK(d.losses[5] != a.losses[5]);
}

TEST_CASE("mock data is Megatron's and learnable; dropout and bf16 train too") {
  MockDataset m(100, 1234, 16);
  std::vector<int32_t> s(17);
  m.sample(Split::kTrain, 0, 17, s.data());
  CHECK(s[0] == 1);
  for (size_t i = 1; i < s.size(); ++i) CHECK((s[i] == s[i - 1] + 1 || s[i] == m.eod() || s[i - 1] == m.eod() || s[i] == 1));
  std::vector<int32_t> next(17);
  m.sample(Split::kTrain, 1, 17, next.data());
  CHECK(next[0] == s[16]);  // consecutive samples overlap by one token

  Config c = tiny_mock_gpt(2, 64, 128);
  c.training.train_iters = 40;
  c.training.lr = 3e-3;
  c.logging.eval_iters = 0;
  c.precision.bf16 = true;
  resolve(c, 1);
  const TrainResult r = train(c, ProcessGroups::single(), {true, 0});
  CHECK(r.losses.back() < r.losses.front() - 1.0);
}

TEST_CASE("non-finite losses are counted, and stop the run after --exit-on-nan-count in a row") {
  for (bool fp16 : {false, true}) {  // in fp16 too: no loss scale cures a non-finite loss
    Config c = tiny_llama_on_shakespeare(10);
    if (fp16) c.precision.bf16 = false, c.precision.fp16 = true;
    c.model.init_method_std = 1e30;  // overflows: every loss is inf or NaN
    c.training.exit_on_nan_count = 3;
    try {
      train(c, ProcessGroups::single(), {true, 0});
      FAIL("expected the run to stop");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find("not finite for 3 iterations in a row (last at iteration 3)") != std::string::npos);
    }
  }
}

TEST_CASE("learning-rate schedules follow Megatron's formulas") {
  Config c;
  c.training.lr = 1.0;
  c.training.min_lr = 0.1;
  c.training.train_iters = 110;
  c.training.lr_warmup_iters = 10;
  c.training.lr_warmup_init = 0.0;
  c.training.lr_decay_style = "linear";
  LrSchedule lin(c);
  CHECK(lin.lr(5) == Approx(0.5));
  CHECK(lin.lr(10) == Approx(1.0));
  CHECK(lin.lr(60) == Approx(0.55));
  CHECK(lin.lr(110) == Approx(0.1));
  CHECK(lin.lr(500) == Approx(0.1));
  c.training.lr_decay_style = "cosine";
  LrSchedule cosine(c);
  CHECK(cosine.lr(60) == Approx(0.55));
  CHECK(cosine.lr(35) == Approx(0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1)));
  c.training.lr_decay_style = "constant";
  CHECK(LrSchedule(c).lr(100) == Approx(1.0));
  c.training.lr_decay_style = "inverse-square-root";
  CHECK(LrSchedule(c).lr(40) == Approx(std::sqrt(10.0 / 40.0)));
  Config big = c;  // counted in samples, as Megatron's scheduler: the same with warmup, by samples without
  big.derived.global_batch_size = 8;
  CHECK(LrSchedule(big).lr(40) == Approx(std::sqrt(10.0 / 40.0)));
  big.training.lr_warmup_iters = 0;
  CHECK(LrSchedule(big).lr(4) == Approx(1.0 / std::sqrt(4.0 * 8)));
  c.training.lr_decay_style = "WSD";
  c.training.lr_wsd_decay_iters = 20;
  c.training.lr_wsd_decay_style = "linear";
  LrSchedule wsd(c);
  CHECK(wsd.lr(80) == Approx(1.0));
  CHECK(wsd.lr(100) == Approx(0.55));
  c.training.lr_decay_style = "linear";
  c.training.lr_warmup_iters = 0;
  c.training.lr_warmup_fraction = 0.1;
  c.training.lr_decay_iters = 200;
  CHECK(LrSchedule(c).warmup_steps() == 20);
}

TEST_CASE("the update uses the rate before its samples (Megatron steps its scheduler after the update)") {
  // With a warmup from --lr-warmup-init 0 the first update has rate 0 (Megatron's first step), so it moves
  // no weight, whatever the weight decay or clipping: the validation loss after it is the same for both.
  auto run = [](double wd, double clip) {
    Config c = tiny_mock_gpt(1, 16, 64);
    c.training.train_iters = 1;
    c.training.lr = 1e-2;
    c.training.lr_warmup_iters = 5;
    c.training.lr_decay_iters = 10;
    c.training.weight_decay = wd;
    c.training.clip_grad = clip;
    c.logging.eval_interval = 1;
    c.logging.eval_iters = 1;
    resolve(c, 1);
    return train(c, ProcessGroups::single(), {true, 0});
  };
  const TrainResult a = run(0.01, 1.0), b = run(0.5, 0.01);
  REQUIRE(a.valid_losses.size() == 2);  // (at iteration 1, and after the last iteration)
  REQUIRE(b.valid_losses.size() == 2);
  CHECK(a.valid_losses[0] == b.valid_losses[0]);
  CHECK(a.valid_losses[1] == b.valid_losses[1]);
}

TEST_CASE("evaluation as Megatron's: the validation batches continue from one evaluation to the next, a last one on each split") {
  // A model that does not move (learning rate 0), so each evaluation's loss is its batches'. Iterations 4, batches of 4.
  auto run = [](int64_t interval, auto&& change) {
    Config c = tiny_mock_gpt(1, 16, 64);
    c.training.train_iters = 4;
    c.training.global_batch_size = 4;
    c.training.lr = 0.0;
    c.logging.eval_interval = interval;
    c.logging.eval_iters = 1;
    change(c);
    REQUIRE(validate(c, 1, Purpose::kTrain).ok());
    resolve(c, 1);
    return train(c, ProcessGroups::single(), {true, 0});
  };
  const auto same = [](Config&) {};
  // Every 2 iterations: at 2 (batch 0), at 4 (batch 1), then the last on the validation split (batch 2) and the test
  // split's first batch (mock data's documents of each split start alike, so its loss is not compared with the
  // validation split's).
  const TrainResult a = run(2, same);
  REQUIRE(a.valid_losses.size() == 3);
  REQUIRE(a.test_losses.size() == 1);
  CHECK(a.valid_losses[0] != a.valid_losses[1]);
  CHECK(a.valid_losses[1] != a.valid_losses[2]);
  // Every 4: at 4 (batch 0), then the last (batch 1); the test split from its start again.
  const TrainResult b = run(4, same);
  REQUIRE(b.valid_losses.size() == 2);
  CHECK(b.valid_losses[0] == a.valid_losses[0]);
  CHECK(b.valid_losses[1] == a.valid_losses[1]);
  REQUIRE(b.test_losses.size() == 1);
  CHECK(b.test_losses[0] == a.test_losses[0]);
  // --eval-global-batch-size 8: batches 0 and 1 in one evaluation, their mean (equal token counts); in microbatches of 2
  // (--eval-micro-batch-size) the same.
  const TrainResult c = run(4, [](Config& x) { x.training.eval_global_batch_size = 8; });
  REQUIRE(c.valid_losses.size() == 2);
  CHECK(c.valid_losses[0] == Approx((a.valid_losses[0] + a.valid_losses[1]) / 2).epsilon(1e-6));
  const TrainResult d = run(4, [](Config& x) {
    x.training.eval_global_batch_size = 8;
    x.training.eval_micro_batch_size = 2;
  });
  REQUIRE(d.valid_losses.size() == 2);
  CHECK(d.valid_losses[0] == Approx(c.valid_losses[0]).epsilon(1e-6));
  CHECK(d.valid_losses[1] == Approx(c.valid_losses[1]).epsilon(1e-6));
  // A run that --exit-interval ends: no evaluation after it.
  const TrainResult e = run(2, [](Config& x) { x.training.exit_interval = 2; });
  CHECK(e.valid_losses.size() == 1);
  CHECK(e.test_losses.empty());
  // The evaluation's batch must be whole microbatches (Megatron's rule).
  Config bad = tiny_mock_gpt(1, 16, 64);
  bad.training.train_iters = 4;
  bad.training.lr = 1e-3;
  bad.training.eval_global_batch_size = 6;
  std::string errors;
  for (const auto& m : validate(bad, 1, Purpose::kTrain).errors) errors += m + "\n";
  CHECK_THAT(errors, MT_CONTAINS("the evaluation's global batch 6 is not divisible by its micro-batch-size(4) x DP(1) = 4"));
}

TEST_CASE("fp16 dynamic loss scaling: shrink once the hysteresis is used up, grow after the window") {
  Config c;
  c.precision.fp16 = true;
  c.precision.initial_loss_scale = 1024;
  c.precision.loss_scale_window = 3;
  c.precision.hysteresis = 2;
  LossScaler s(c);
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));   // skip, hysteresis 2 -> 1
  CHECK(s.scale() == 1024);
  CHECK(s.update(true));   // skip, halve
  CHECK(s.scale() == 512);
  CHECK(s.update(true));  // hysteresis used up: every further overflow halves (Megatron's DynamicGradScaler)
  CHECK(s.scale() == 256);
  CHECK_FALSE(s.update(false));
  CHECK_FALSE(s.update(false));
  CHECK_FALSE(s.update(false));
  CHECK(s.scale() == 512);  // a clean window doubles and restores the hysteresis
  CHECK(s.update(true));
  CHECK(s.scale() == 512);
  CHECK(s.update(true));
  CHECK(s.scale() == 256);
  Config b;
  b.precision.bf16 = true;
  CHECK(LossScaler(b).scale() == 1.0f);
}

TEST_CASE("fp16 loss scaler restore: only a dynamic run's state, into a dynamic scaler (as Megatron)") {
  Config c;
  c.precision.fp16 = true;
  c.precision.initial_loss_scale = 1024;
  c.precision.loss_scale_window = 3;
  LossScaler dyn(c);
  dyn.restore({1.0f, 2, 0, false});  // a bf16 run's state: not a loss scale to continue from
  CHECK(dyn.scale() == 1024);
  dyn.restore({256.0f, 1, 7, true});  // an older count past the window: taken modulo the window
  CHECK(dyn.scale() == 256);
  CHECK(dyn.state().clean_steps == 1);
  CHECK(dyn.state().dynamic);
  CHECK_FALSE(dyn.update(false));
  CHECK_FALSE(dyn.update(false));
  CHECK(dyn.scale() == 512);
  Config st = c;
  st.precision.loss_scale = 128.0;
  LossScaler fixed(st);
  fixed.restore({256.0f, 1, 0, true});  // --loss-scale wins over the checkpoint
  CHECK(fixed.scale() == 128);
  CHECK_FALSE(fixed.state().dynamic);
}

TEST_CASE("AdamW step: decoupled decay, bias correction, no decay on norms; bf16 working weights") {
  Config c;
  c.training.weight_decay = 0.1;
  c.training.clip_grad = 0;
  c.precision.bf16 = true;
  ParamStore ps;
  auto param = [](const char* name, std::vector<int64_t> shape, bool decay) {
    ParamInfo p;
    p.name = name;
    p.local_shape = shape;
    p.global_shape = std::move(shape);
    p.init = InitKind::kOnes;
    p.weight_decay = decay;
    return p;
  };
  const ParamInfo w = param("w", std::vector<int64_t>{2, 1}, true);
  const ParamInfo n = param("norm", std::vector<int64_t>(1, 1), false);
  ps.add(w);
  ps.add(n);
  ps.allocate();
  ps.initialize(1);
  ps.param(0)[1] = 1.001f;  // not bf16-representable: the working copy rounds it
  Optimizer opt(c, ps, ProcessGroups::single());
  CHECK(ps.param(0)[1] == round_bf16(1.001f));
  for (int i = 0; i < 3; ++i) ps.grad(static_cast<size_t>(i / 2))[i % 2] = 0.5f;
  const StepResult r = opt.step(0.01, 1.0f);
  CHECK(r.grad_norm == Approx(std::sqrt(3 * 0.25)));
  // First Adam step: m/bc1 = g, v/bc2 = g^2, update = g/(|g|+eps) ~ 1.
  CHECK(ps.param(0)[0] == round_bf16(static_cast<float>(1.0 - 0.01 * (1.0 + 0.1 * 1.0))));
  CHECK(ps.param(1)[0] == round_bf16(static_cast<float>(1.0 - 0.01 * 1.0)));
}

TEST_CASE("optimizer segments: owned ranges cut at parameter boundaries, state back to back in range order") {
  ParamStore ps;
  for (const char* name : {"a", "b", "c"}) {
    ParamInfo p;
    p.name = name;
    p.local_shape = p.global_shape = {10};
    ps.add(p);
  }
  // A distributed-optimizer shard: [5, 12) crosses a/b, [25, 30) is the tail of c; given out of order.
  const auto seg = Optimizer::make_segments(ps, {{25, 30}, {5, 12}});
  REQUIRE(seg.size() == 3);
  CHECK((seg[0].param == 0 && seg[0].begin == 5 && seg[0].end == 10 && seg[0].state == 0));
  CHECK((seg[1].param == 1 && seg[1].begin == 10 && seg[1].end == 12 && seg[1].state == 5));
  CHECK((seg[2].param == 2 && seg[2].begin == 25 && seg[2].end == 30 && seg[2].state == 7));
  // Everything owned: the state is laid out like the parameters (what the CUDA engine relies on).
  for (const auto& s : Optimizer::make_segments(ps, {{0, ps.numel()}})) CHECK(s.state == s.begin);
}

TEST_CASE("the CUDA engine names what it does not run") {
  Config c;
  apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
  resolve(c, 1, 257);
  auto gaps_text = [](const std::vector<std::string>& g) {
    std::string all;
    for (const auto& s : g) all += s + "\n";
    return all;
  };
  if (!built_with_cuda()) {
    CHECK_THAT(gaps_text(cuda_engine_gaps(c, 1)), MT_CONTAINS("no CUDA backend"));
    return;
  }
  CHECK_THAT(gaps_text(cuda_engine_gaps(c, 1)), MT_CONTAINS("add --bf16"));  // the quickstart is fp32
  c.precision.bf16 = true;
  CHECK(cuda_engine_gaps(c, 1).empty());
  Config d = c;
  d.model.hidden_dropout = 0.1;
  CHECK(cuda_engine_gaps(d, 1).empty());  // hidden dropout runs on the CUDA engine
  d.model.attention_dropout = 0.1;
  CHECK(cuda_engine_gaps(d, 1).empty());  // and attention dropout (cuDNN's generator)
  Config q = c;
  q.model.qk_layernorm = true;
  CHECK(cuda_engine_gaps(q, 1).empty());
  q.parallel.tensor_model_parallel_size = 2;
  q.model.group_query_attention = true;
  q.model.num_query_groups = 1;
  resolve(q, 2, 257);
  CHECK_THAT(gaps_text(cuda_engine_gaps(q, 2)), MT_CONTAINS("--qk-layernorm with fewer query groups"));  // K/V replication
  Config e = c;
  e.model.kv_channels = 12;  // head dimension 12
  CHECK_THAT(gaps_text(cuda_engine_gaps(e, 1)), MT_CONTAINS("multiple of 8"));
  Config t = c;
  t.parallel.tensor_model_parallel_size = 2;
  t.parallel.sequence_parallel = true;
  CHECK(cuda_engine_gaps(t, 2).empty());  // 2 query groups over TP 2
  t.model.num_query_groups = 1;  // K/V replication
  CHECK(cuda_engine_gaps(t, 2).empty());
  Config o = c;
  o.training.use_distributed_optimizer = true;
  CHECK(cuda_engine_gaps(o, 2).empty());
  o.training.overlap_param_gather = true;  // the gather overlapped with the next forward
  CHECK(cuda_engine_gaps(o, 2).empty());
  // --add-qkv-bias alone (Qwen's QKV biases): on one GPU (and data parallel) since its GPU tests passed; under TP refused
  // by name until it has run on several GPUs.
  Config qkv_bias = c;
  qkv_bias.model.disable_bias_linear = true;
  qkv_bias.model.add_qkv_bias = true;
  CHECK(cuda_engine_gaps(qkv_bias, 1).empty());
  CHECK(cuda_engine_gaps(qkv_bias, 2).empty());  // (DP 2)
  qkv_bias.parallel.tensor_model_parallel_size = 2;
  qkv_bias.parallel.sequence_parallel = true;
  CHECK_THAT(gaps_text(cuda_engine_gaps(qkv_bias, 2)), MT_CONTAINS("--add-qkv-bias with tensor parallelism has not run on several GPUs"));
  // MoE: one GPU; data parallelism refused by name until it has run on several GPUs, and with that gate lifted the
  // layouts and settings it does not cover still refused by name.
  Config m = c;
  m.model.disable_bias_linear = true;
  m.moe.num_experts = 4;
  m.moe.moe_router_topk = 2;
  CHECK(cuda_engine_gaps(m, 1).empty());
  CHECK_THAT(gaps_text(cuda_engine_gaps(m, 2)), MT_CONTAINS("mixture of experts with data parallelism has not run"));
  // Biases (the router's and the experts') and squared ReLU experts: on one GPU, any number of experts (the flat
  // buffers keep the parameter after the router's bias aligned).
  Config biased = m;
  biased.model.disable_bias_linear = false;
  biased.model.squared_relu = true;
  CHECK(cuda_engine_gaps(biased, 1).empty());
  biased.moe.num_experts = 8;
  CHECK(cuda_engine_gaps(biased, 1).empty());
  biased.moe.moe_router_dtype = "fp64";  // (the logits summed in double)
  CHECK(cuda_engine_gaps(biased, 1).empty());
  biased.moe.moe_ffn_hidden_size = 100;  // (the experts' rows and biases 16-byte aligned)
  CHECK_THAT(gaps_text(cuda_engine_gaps(biased, 1)), MT_CONTAINS("need --moe-ffn-hidden-size / --expert-tensor-parallel-size to be a multiple of 8"));
  // fp16: on one GPU; with expert parallelism not.
  Config half = m;
  half.precision.bf16 = false;
  half.precision.fp16 = true;
  CHECK(cuda_engine_gaps(half, 1).empty());
  half.parallel.expert_model_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(half, 2)), MT_CONTAINS("expert parallelism in fp16 is not implemented"));
  const char* before = std::getenv("MEGATRAIN_CUDA_UNVERIFIED");
  const std::string saved = before ? before : "";
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel", 1);
  CHECK(cuda_engine_gaps(m, 2).empty());
  Config overlap = m;  // (the dense buckets overlapped, the experts' after the backward)
  overlap.training.overlap_grad_reduce = true;
  overlap.training.use_distributed_optimizer = true;
  overlap.training.overlap_param_gather = true;
  CHECK(cuda_engine_gaps(overlap, 2).empty());
  Config global = m;
  global.moe.moe_router_load_balancing_type = {"global_aux_loss"};
  global.moe.moe_aux_loss_coeff = {1e-2};
  CHECK_THAT(gaps_text(cuda_engine_gaps(global, 2)), MT_CONTAINS("global_aux_loss with data parallelism"));
  // TP: the experts split over expert-TP = TP (Megatron's default); another expert-TP size refused by name.
  Config tensor = m;
  tensor.parallel.tensor_model_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(tensor, 2)), MT_CONTAINS("--expert-tensor-parallel-size other than --tensor-model-parallel-size"));
  tensor.derived.expert_tensor_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(tensor, 2)), MT_CONTAINS("mixture of experts with tensor parallelism has not run"));
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel,moe-tensor-parallel", 1);
  CHECK(cuda_engine_gaps(tensor, 2).empty());
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel", 1);
  Config expert_tensor = m;
  expert_tensor.derived.expert_tensor_parallel_size = 2;  // (TP 1 with --expert-tensor-parallel-size 2)
  CHECK_THAT(gaps_text(cuda_engine_gaps(expert_tensor, 2)), MT_CONTAINS("--expert-tensor-parallel-size other than --tensor-model-parallel-size"));
  global.moe.moe_aux_loss_coeff = {0.0};  // (no aux loss: nothing counted over DP)
  CHECK(cuda_engine_gaps(global, 2).empty());
  // --calculate-per-token-loss with MoE: both engines run it.
  Config per_token = m;
  per_token.training.calculate_per_token_loss = true;
  CHECK_THAT(gaps_text(unsupported_features(per_token, 1, false)), !MT_CONTAINS("--calculate-per-token-loss"));
  CHECK_THAT(gaps_text(cuda_engine_gaps(per_token, 1)), !MT_CONTAINS("--calculate-per-token-loss"));
  // Pipeline parallelism with MoE: behind the pipeline's own gate (not the data-parallel one at DP 1); global_aux_loss
  // (several microbatches in flight) and ZB-H1 (the experts' weight gradients with the backward) refused by name.
  unsetenv("MEGATRAIN_CUDA_UNVERIFIED");
  Config pipeline = m;
  pipeline.parallel.pipeline_model_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(pipeline, 2)), MT_CONTAINS("--pipeline-model-parallel-size > 1 has not run on GPUs yet"));
  CHECK_THAT(gaps_text(cuda_engine_gaps(pipeline, 2)), !MT_CONTAINS("mixture of experts"));
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "pipeline-parallel", 1);
  CHECK(cuda_engine_gaps(pipeline, 2).empty());
  CHECK_THAT(gaps_text(cuda_engine_gaps(pipeline, 4)), MT_CONTAINS("mixture of experts with data parallelism has not run"));
  Config pipeline_global = pipeline;
  pipeline_global.moe.moe_router_load_balancing_type = {"global_aux_loss"};
  pipeline_global.moe.moe_aux_loss_coeff = {1e-2};
  CHECK_THAT(gaps_text(cuda_engine_gaps(pipeline_global, 2)), MT_CONTAINS("global_aux_loss with pipeline parallelism"));
  Config pipeline_zb = pipeline;
  pipeline_zb.parallel.pipeline_schedule = "zb-h1";
  CHECK_THAT(gaps_text(cuda_engine_gaps(pipeline_zb, 2)), MT_CONTAINS("zb-h1 with MoE layers"));
  // Context parallelism with MoE: behind its own gate; capacity factors and EP with it refused by name.
  Config context = m;
  context.parallel.context_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(context, 2)), MT_CONTAINS("--context-parallel-size > 1 on the CUDA engine has not run"));
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "context-parallel", 1);
  CHECK(cuda_engine_gaps(context, 2).empty());
  Config context_capacity = context;
  context_capacity.moe.moe_expert_capacity_factor = 1.0;
  CHECK_THAT(gaps_text(cuda_engine_gaps(context_capacity, 2)), MT_CONTAINS("--moe-expert-capacity-factor with context parallelism"));
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel", 1);
  // Expert parallelism: refused by name until it has run on several GPUs; with that gate lifted, the distributed
  // optimizer required.
  Config expert = m;
  expert.parallel.expert_model_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(expert, 2)), MT_CONTAINS("--expert-model-parallel-size > 1 has not run on GPUs yet"));
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel,expert-parallel,moe-tensor-parallel", 1);
  CHECK_THAT(gaps_text(cuda_engine_gaps(expert, 2)), MT_CONTAINS("needs --use-distributed-optimizer"));
  expert.training.use_distributed_optimizer = true;
  CHECK(cuda_engine_gaps(expert, 2).empty());
  Config allgather = expert;  // (Megatron's default dispatcher: the CUDA engine's all-to-all, said once)
  allgather.moe.moe_token_dispatcher_type = "allgather";
  CHECK_THAT(gaps_text(inert_flag_notes(allgather, true)), MT_CONTAINS("dispatches by all-to-all"));
  allgather.moe.moe_token_dispatcher_type = "alltoall";
  CHECK_THAT(gaps_text(inert_flag_notes(allgather, true)), !MT_CONTAINS("dispatches by all-to-all"));
  Config expert_overlap = expert;  // (the overlaps: EP = DP only, one communicator)
  expert_overlap.training.overlap_grad_reduce = true;
  expert_overlap.derived.data_parallel_size = 2;
  CHECK(cuda_engine_gaps(expert_overlap, 2).empty());
  expert_overlap.derived.data_parallel_size = 4;
  CHECK_THAT(gaps_text(cuda_engine_gaps(expert_overlap, 4)), MT_CONTAINS("expert parallelism smaller than data parallelism"));
  expert.parallel.tensor_model_parallel_size = 2;
  expert.parallel.sequence_parallel = true;
  CHECK_THAT(gaps_text(cuda_engine_gaps(expert, 4)), MT_CONTAINS("--expert-tensor-parallel-size other than --tensor-model-parallel-size has not run"));
  expert.derived.expert_tensor_parallel_size = 2;  // (EP 2 x TP 2, the experts' shards over TP)
  CHECK(cuda_engine_gaps(expert, 4).empty());
  // Expert-TP other than TP (Megatron's folding): refused by name until it has run on GPUs; with that gate lifted, what it
  // does not cover still refused by name.
  Config folded = expert;  // (TP 2 x DP 2, expert-TP 1 x EP 2 x expert-DP 2)
  folded.derived.expert_tensor_parallel_size = 1;
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "moe-data-parallel,expert-parallel,moe-tensor-parallel,expert-tensor-parallel", 1);
  CHECK(cuda_engine_gaps(folded, 4).empty());
  folded.training.use_distributed_optimizer = false;
  CHECK_THAT(gaps_text(cuda_engine_gaps(folded, 4)), MT_CONTAINS("with data parallelism needs --use-distributed-optimizer"));
  CHECK(cuda_engine_gaps(folded, 2).empty());  // (TP 2 = expert-TP 1 x EP 2: no data parallelism, each expert on one rank)
  folded.parallel.expert_model_parallel_size = 1;  // (TP 2 with expert-TP 1 and no EP: expert-DP 2 without DP)
  CHECK_THAT(gaps_text(cuda_engine_gaps(folded, 2)), MT_CONTAINS("each expert shard on one rank; expert-DP is 2"));
  folded.parallel.expert_model_parallel_size = 2;
  folded.training.use_distributed_optimizer = true;
  folded.training.overlap_grad_reduce = true;
  CHECK_THAT(gaps_text(cuda_engine_gaps(folded, 4)), MT_CONTAINS("beside the expert-TP gathers"));
  folded.training.overlap_grad_reduce = false;
  folded.moe.moe_apply_probs_on_input = true;
  CHECK_THAT(gaps_text(cuda_engine_gaps(folded, 4)), MT_CONTAINS("--moe-apply-probs-on-input with --expert-tensor-parallel-size"));
  unsetenv("MEGATRAIN_CUDA_UNVERIFIED");
  // --moe-router-force-load-balancing: on one GPU (its tests passed in the thirty-fourth session); with CP not at all.
  Config balanced = m;
  balanced.moe.moe_router_force_load_balancing = true;
  CHECK(cuda_engine_gaps(balanced, 1).empty());
  setenv("MEGATRAIN_CUDA_UNVERIFIED", "context-parallel", 1);
  balanced.parallel.context_parallel_size = 2;
  CHECK_THAT(gaps_text(cuda_engine_gaps(balanced, 2)), MT_CONTAINS("--moe-router-force-load-balancing with context parallelism"));
  unsetenv("MEGATRAIN_CUDA_UNVERIFIED");
  folded.moe.moe_apply_probs_on_input = false;
  CHECK_THAT(gaps_text(cuda_engine_gaps(folded, 4)), MT_CONTAINS("--expert-tensor-parallel-size other than --tensor-model-parallel-size has not run"));
  if (before) setenv("MEGATRAIN_CUDA_UNVERIFIED", saved.c_str(), 1);
  else unsetenv("MEGATRAIN_CUDA_UNVERIFIED");
}

TEST_CASE("batch-size ramp-up: Megatron's steps, a pure function of the consumed samples") {
  Config c;
  c.training.micro_batch_size = 2;
  c.derived.global_batch_size = 64;
  c.training.rampup_batch_size = {"16", "16", "1000"};  // 3 increments, one per 333.3 samples
  const BatchSchedule b(c, 2);
  CHECK(b.ramping());
  CHECK(b.global_batch(0) == 16);
  CHECK(b.global_batch(333) == 16);
  CHECK(b.global_batch(334) == 32);
  CHECK(b.global_batch(667) == 48);
  CHECK(b.global_batch(1000) == 64);
  CHECK(b.global_batch(5000) == 64);
  CHECK(b.microbatches(334) == 8);  // 32 / (2 x DP 2)
  // Megatron's update_train_iters: the ramp's iterations while consumed <= ramp samples, then whole batches.
  Config small = c;
  small.derived.global_batch_size = 16;
  small.training.rampup_batch_size = {"4", "4", "32"};
  const BatchSchedule s(small, 1);
  CHECK(s.train_iterations(96) == 9);  // 4 4 4 8 8 12 (40 samples) + 3 x 16
  CHECK(s.samples_after(9) == 88);     // the partial last batch dropped
  c.training.rampup_batch_size.clear();
  CHECK(!BatchSchedule(c, 2).ramping());
  CHECK(BatchSchedule(c, 2).global_batch(0) == 64);
  CHECK(BatchSchedule(c, 2).train_iterations(1000) == 15);
}

TEST_CASE("--step-batch-size-schedule: Megatron's parse and steps, a pure function of the consumed samples") {
  // Megatron's example, thresholds in tokens at 4096 per sample (250B tokens: 61,035,156 samples, integer division).
  const auto steps = parse_batch_steps("0:768 250B:1536 500B:3072 750B:6144", 4096);
  REQUIRE(steps.size() == 4);
  CHECK((steps[1].from_samples == 61035156 && steps[1].batch == 1536));
  CHECK((steps[3].from_samples == 183105468 && steps[3].batch == 6144));
  // Commas, lower-case and decimal suffixes, any order (sorted); a suffix on a batch size.
  const auto mixed = parse_batch_steps(" 1.5k:16, 0:8 ,3K:1k", 100);
  REQUIRE(mixed.size() == 3);
  CHECK((mixed[0].from_samples == 0 && mixed[0].batch == 8));
  CHECK((mixed[1].from_samples == 15 && mixed[1].batch == 16));
  CHECK((mixed[2].from_samples == 30 && mixed[2].batch == 1000));
  auto refused = [](const std::string& text, int64_t seq) {
    try {
      parse_batch_steps(text, seq);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("0:8 100", 10), MT_CONTAINS("entry '100' has no ':'"));
  CHECK_THAT(refused("0:8 1Q:16", 10), MT_CONTAINS("entry '1Q:16' has no number"));
  CHECK_THAT(refused("100:8", 10), MT_CONTAINS("the first threshold must be 0, got 10 samples"));
  CHECK_THAT(refused("0:8 5:16", 10), MT_CONTAINS("strictly increasing in samples"));  // (5 tokens: sample 0 again)
  CHECK_THAT(refused("0:0", 10), MT_CONTAINS("every batch size must be positive"));
  CHECK_THAT(refused(" , ", 10), MT_CONTAINS("no entries"));
  // The schedule's batches: from each threshold on; Megatron's update_train_iters loop for --train-samples (the last
  // iteration may pass them); the samples consumed; whole microbatches checked from the batch in effect on.
  Config c;
  c.training.micro_batch_size = 2;
  c.data.seq_length = 10;
  c.derived.global_batch_size = 4;  // (micro batch x DP, Megatron's global_batch_size beside a schedule)
  c.training.step_batch_size_schedule = "0:4 200:8 400:12";  // samples 0, 20, 40
  const BatchSchedule b(c, 2);
  CHECK(b.stepping());
  CHECK(b.global_batch(0) == 4);
  CHECK(b.global_batch(19) == 4);
  CHECK(b.global_batch(20) == 8);
  CHECK(b.global_batch(1000) == 12);
  CHECK(b.max_global_batch() == 12);
  CHECK(b.microbatches(20) == 2);
  CHECK(b.train_iterations(50) == 9);  // 5 x 4, 3 x 8 (44), then 12: 56 >= 50
  CHECK(b.samples_after(9) == 56);
  CHECK_NOTHROW(b.check_from(0, 1000, 1));  // (4, 8 and 12 over micro batch 2 x DP 2)
  Config early = c;
  early.training.step_batch_size_schedule = "0:6 200:8";  // (6 does not split over micro batch 2 x DP 2, 8 does)
  const BatchSchedule e(early, 2);
  CHECK_THROWS_WITH(e.check_from(0, 1000, 1), MT_CONTAINS("the batch size 6 (from 0 tokens on)"));
  CHECK_NOTHROW(e.check_from(20, 1000, 1));  // (resumed past it, as Megatron checks only the batch in effect)
  CHECK_NOTHROW(b.check_from(20, 40, 2));  // (a run that ends before 40 samples never reaches the 12)
  CHECK_NOTHROW(e.check_from(20, 1000, 2));  // (interleaved over PP 2: 8 samples are 2 microbatches per DP rank, a multiple of PP)
  CHECK_THROWS_WITH(b.check_from(20, 1000, 2), MT_CONTAINS("the batch size 12 (from 400 tokens on) is not a multiple of micro-batch-size x DP x PP "
                                                     "(interleaved) = 8"));  // (12: 3 microbatches per DP rank)
}

TEST_CASE("a ramped-up run: batch sizes and samples as scheduled, learning rate by samples, resumed mid-ramp bit for bit") {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_rampup_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto config = [&](const std::string& log_dir, bool ramp = true) {
    Config c;
    apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
    c.data.text_data_path = kShakespeare;
    c.data.seq_length = 32;
    c.training.micro_batch_size = 4;
    c.training.train_iters.reset();
    c.training.train_samples = 96;
    if (ramp) c.training.rampup_batch_size = {"4", "4", "32"};  // 4 until 10.7 samples, 8 until 21.3, 12 until 32, then 16
    else c.training.global_batch_size = 4;
    c.training.lr_warmup_iters = 0;
    c.training.lr_warmup_samples = 32;
    c.training.lr_decay_samples = 96;
    c.logging.log_interval = 1;
    c.logging.eval_iters = 0;
    c.logging.log_dir = (dir / log_dir).string();
    REQUIRE(validate(c, 1, Purpose::kTrain).ok());
    resolve(c, 1, 257);
    return c;
  };
  const Config c = config("full");
  const TrainResult full = train(c, ProcessGroups::single(), {true, 0});
  REQUIRE(full.iterations == 9);  // Megatron's count: the ramp to 40 samples, then 3 full batches (88 of 96)
  std::ifstream in(dir / "full" / "metrics.jsonl");
  std::vector<int64_t> batch, consumed;
  std::vector<double> lr;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    batch.push_back(j.at("global_batch_size").get<int64_t>());
    consumed.push_back(j.at("consumed_samples").get<int64_t>());
    lr.push_back(j.at("learning_rate").get<double>());
  }
  CHECK(batch == std::vector<int64_t>{4, 4, 4, 8, 8, 12, 16, 16, 16});
  CHECK(consumed == std::vector<int64_t>{4, 8, 12, 20, 28, 40, 56, 72, 88});
  const LrSchedule sched(c);
  for (size_t i = 0; i < lr.size(); ++i) CHECK(lr[i] == Approx(sched.lr_at_samples(consumed[i])));
  CHECK(lr[1] == Approx(3e-3 * 8.0 / 32.0));  // warmup by samples: 8 of 32
  // While the batch is 4, the run is a plain batch-4 run (same data, gradient scale and learning rate).
  const TrainResult plain = train(config("plain", false), ProcessGroups::single(), {true, 0});
  for (size_t i = 0; i < 3; ++i) CHECK(plain.losses[i] == full.losses[i]);
  // Saved after iteration 4 (20 samples, batch 8), resumed: the rest of the ramp and the losses as before.
  Config save = config("first");
  save.checkpoint.save = (dir / "ckpt").string();
  save.checkpoint.save_interval = 4;
  save.training.exit_interval = 4;
  train(save, ProcessGroups::single(), {true, 0});
  Config resume = config("second");
  resume.checkpoint.load = (dir / "ckpt").string();
  const TrainResult rest = train(resume, ProcessGroups::single(), {true, 0});
  REQUIRE(rest.losses.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(rest.losses[i] == full.losses[i + 4]);
  std::filesystem::remove_all(dir);
}

TEST_CASE("--log-num-zeros-in-grad: the gradient's zero entries, counted as Megatron's count_zeros_fp32 and logged after the grad norm") {
  Config c;
  c.training.clip_grad = 1.0;
  c.logging.log_num_zeros_in_grad = true;
  ParamStore ps;
  for (const char* name : {"w", "norm"}) {
    ParamInfo p;
    p.name = name;
    p.local_shape = p.global_shape = {name[0] == 'w' ? int64_t{4} : int64_t{2}};
    p.init = InitKind::kOnes;
    ps.add(p);
  }
  ps.allocate();
  ps.initialize(1);
  Optimizer opt(c, ps, ProcessGroups::single());
  const float grads[6] = {0.0f, 0.5f, 0.0f, -0.25f, 0.0f, 1.0f};
  auto step = [&](Optimizer& o, float last) {
    for (int i = 0; i < 6; ++i) ps.grad(static_cast<size_t>(i / 4))[i % 4] = i == 5 ? last : grads[i];
    return o.step(0.01, 1.0f);
  };
  CHECK(step(opt, 1.0f).num_zeros == 3);
  CHECK(step(opt, INFINITY).num_zeros == -1);  // a skipped step: none (Megatron's None)
  c.logging.log_num_zeros_in_grad = false;
  Optimizer quiet(c, ps, ProcessGroups::single());
  CHECK(step(quiet, 1.0f).num_zeros == -1);
  // The log line: after the grad norm, as Megatron's " num zeros: 3.0 |"; nothing where there is no count.
  IterationStats s;
  s.grad_norm = 1.5;
  s.num_zeros = 3;
  CHECK_THAT(format_iteration_line(s), MT_CONTAINS("| grad norm: 1.500 | num zeros: 3.0 | number of skipped iterations:"));
  s.num_zeros = -1;
  CHECK_THAT(format_iteration_line(s), !MT_CONTAINS("num zeros"));
  // A training on bytes: every iteration counted, the bytes no sample holds leaving the input embedding's rows at 0, and the
  // last count is the zero entries of the model's last gradient (one rank: every parameter once).
  Config t = tiny_llama_on_shakespeare(3);
  t.logging.log_num_zeros_in_grad = true;
  const TrainResult r = train(t, ProcessGroups::single(), {true, 0});
  REQUIRE(r.num_zeros.size() == 3);
  const ParamStore& trained = r.model->params();
  double zeros = 0;
  for (int64_t i = 0; i < trained.numel(); ++i) zeros += trained.grads().f32()[i] == 0.0f ? 1 : 0;
  INFO("counted " << r.num_zeros.back() << ", in the gradient buffer " << zeros << " of " << trained.numel());
  CHECK(r.num_zeros.back() == zeros);
  CHECK(zeros >= static_cast<double>(*t.model.hidden_size));
  if (built_with_cuda()) {  // (the CUDA engine counts them too, and runs GELU's erf form: their GPU groups passed)
    t.precision.bf16 = true;
    std::string gaps;
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("num-zeros"));
    t.logging.log_num_zeros_in_grad = false;
    t.model.swiglu = false;
    t.model.disable_bias_linear = true;
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("GELU"));
    // --deterministic-mode: on one GPU (cuDNN's deterministic attention backward); refused on several until it has run there
    t.training.deterministic_mode = true;
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("deterministic"));
    for (const auto& g : cuda_engine_gaps(t, 2)) gaps += g + "\n";
    CHECK_THAT(gaps, MT_CONTAINS("--deterministic-mode on the CUDA engine has not run on several GPUs yet"));
    // --eval-global-batch-size other than the training batch: runs (its GPU group =evaluation passed on an H100 in the
    // fortieth session); another evaluation microbatch stays refused
    t.training.deterministic_mode = false;
    t.training.eval_global_batch_size = 2 * t.derived.global_batch_size;
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("eval-global-batch-size"));
    t.training.eval_micro_batch_size = 2 * t.training.micro_batch_size.value_or(1);
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, MT_CONTAINS("--eval-micro-batch-size other than --micro-batch-size is not implemented on the CUDA engine"));
    // --window-size: runs (its GPU group =window passed on an H200 in the forty-first session)
    t.training.eval_micro_batch_size.reset();
    t.model.window_size = "3,0";
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("--window-size"));
    t.model.window_size = "-1,0";
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(t, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("--window-size"));
    // GPT-OSS's pieces run (their GPU group =gpt-oss passed in the forty-second session)
    t.model.window_size.reset();
    Config oss = t;
    oss.model.quick_geglu = true;
    oss.model.glu_linear_offset = 1.0;
    oss.model.activation_func_clamp_value = 7.0;
    oss.model.position_embedding_type = "yarn";
    oss.model.softmax_type = "learnable";
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(oss, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, !MT_CONTAINS("--quick-geglu"));
    CHECK_THAT(gaps, !MT_CONTAINS("yarn"));
    CHECK_THAT(gaps, !MT_CONTAINS("--softmax-type"));
    // (and with context parallelism, which the CPU engine has for the sinks and windows, not the CUDA engine)
    oss.parallel.context_parallel_size = 2;
    oss.model.window_size = "3,0";
    gaps.clear();
    for (const auto& g : cuda_engine_gaps(oss, 2)) gaps += g + "\n";
    CHECK_THAT(gaps, MT_CONTAINS("--softmax-type learnable with context parallelism is not implemented on the CUDA engine"));
    CHECK_THAT(gaps, MT_CONTAINS("--window-size with context parallelism is not implemented on the CUDA engine"));
  }
}

namespace {
// A data-parallel group of two seen from rank 0 whose other rank holds `other` in place of this rank's values.
class TwoReplicas : public test::NoCollectives {
 public:
  explicit TwoReplicas(double shift) : NoCollectives(0, 2), shift_(shift) {}
  void all_reduce(double* data, int64_t n, ReduceOp op) override {
    if (op != ReduceOp::kMax) fail();
    // (pairs of a value's bit pattern p and -p: the other rank's first pattern shifted by shift_)
    for (int64_t i = 0; i + 1 < n; i += 2) {
      const double other = data[i] + (i == 0 ? shift_ : 0.0);
      data[i + 1] = std::max(data[i + 1], -other);
      data[i] = std::max(data[i], other);
    }
  }

 private:
  double shift_;
};
}  // namespace

TEST_CASE("--test-mode: the query / key norms compared across replicas, a difference ends the run by name") {
  Config c = tiny_mock_gpt(1, 16, 64);
  c.model.qk_layernorm = true;
  resolve(c, 1);
  GPTModel model(c, ProcessGroups::single());
  const std::vector<size_t> norms = realtime_test_params(model.params());
  REQUIRE(norms.size() == 4);  // (LayerNorm: the query and key norms' weights and biases)
  TwoReplicas same(0.0), corrupted(1.0);  // (the other rank's first value one bit pattern apart: the smallest change a float can take)
  CHECK_NOTHROW(check_replicas_equal(model.params(), norms, same, "data-parallel"));
  CHECK_THROWS_WITH(check_replicas_equal(model.params(), norms, corrupted, "data-parallel"),
                    MT_CONTAINS("layers.0.attention.q_norm.weight differs between the data-parallel ranks"));
  // A training with the flag (one rank: nothing to compare, the run unchanged) and the refusal on the CUDA engine.
  c.training.test_mode = true;
  c.training.train_iters = 2;
  c.training.lr = 1e-3;
  CHECK(train(c, ProcessGroups::single(), {true, 0}).losses.size() == 2);
  if (built_with_cuda()) {
    c.precision.bf16 = true;
    std::string gaps;
    for (const auto& g : cuda_engine_gaps(c, 1)) gaps += g + "\n";
    CHECK_THAT(gaps, MT_CONTAINS("--test-mode (Megatron's real-time replica test) is implemented on the CPU engine only"));
  }
}
