// test_validate.cpp: every rule of REFERENCE.md section 2 rejects and accepts, and all violations
// are reported at once.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "catch.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/pipeline_layout.h"
#include "config/errors.h"

using namespace mt;

namespace {

Config base() {
  Config c;
  c.model.num_layers = 8;
  c.model.hidden_size = 256;
  c.model.num_attention_heads = 8;
  c.model.max_position_embeddings = 512;
  c.data.seq_length = 512;
  c.training.micro_batch_size = 2;
  c.training.train_iters = 10;
  c.training.lr = 1e-3;
  c.data.mock_data = true;
  return c;
}

bool has(const std::vector<std::string>& v, const std::string& needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

void rejects(const Config& c, int64_t world, const std::string& needle) {
  const Diagnostics d = validate(c, world, Purpose::kTrain);
  INFO("expected an error containing: " << needle);
  for (const auto& e : d.errors) INFO("got: " << e);
  CHECK(has(d.errors, needle));
}

void accepts(const Config& c, int64_t world) {
  const Diagnostics d = validate(c, world, Purpose::kTrain);
  std::string all;
  for (const auto& e : d.errors) all += e + "\n";
  INFO(all);
  CHECK(d.ok());
}

}  // namespace

TEST_CASE("base config is valid") { accepts(base(), 1); }

TEST_CASE("world size divisible by TP x PP x CP") {
  Config c = base();
  c.parallel.tensor_model_parallel_size = 4;
  c.parallel.pipeline_model_parallel_size = 4;
  rejects(c, 12, "world size 12 is not divisible by TP(4) x PP(4) x CP(1) = 16");
  accepts(c, 32);
}

TEST_CASE("expert grid") {
  Config c = base();
  c.moe.num_experts = 8;
  c.parallel.expert_model_parallel_size = 4;
  c.parallel.tensor_model_parallel_size = 2;
  c.parallel.sequence_parallel = true;
  c.model.disable_bias_linear = true;
  rejects(c, 4, "expert grid ETP(2) x EP(4) x PP(1) = 8");
  accepts(c, 8);
  c.moe.num_experts = 6;
  rejects(c, 8, "--num-experts 6 is not divisible by EP(4)");
  Config d = base();
  d.parallel.expert_model_parallel_size = 2;
  rejects(d, 2, "needs an MoE model: add --num-experts");
  Config e = base();
  e.moe.num_experts = 4;
  e.moe.moe_router_topk = 5;
  rejects(e, 1, "--moe-router-topk 5 must be between 1 and --num-experts 4");
}

TEST_CASE("the load-balancing types: one, or Megatron's list form with a coefficient each") {
  Config c = base();
  c.moe.num_experts = 4;
  c.moe.moe_router_load_balancing_type = {"aux_loss", "seq_aux_loss"};
  c.moe.moe_aux_loss_coeff = {1e-2, 1e-3};
  accepts(c, 1);
  c.moe.moe_aux_loss_coeff = {1e-2};
  rejects(c, 1, "gives 2 types and --moe-aux-loss-coeff 1 coefficients");
  c.moe.moe_router_load_balancing_type = {"aux_loss"};
  c.moe.moe_aux_loss_coeff = {1e-2, 1e-3};
  rejects(c, 1, "gives 2 coefficients for the one load-balancing type aux_loss");
  c.moe.moe_router_load_balancing_type = {"aux_loss", "aux_loss"};
  rejects(c, 1, "names aux_loss twice");
  c.moe.moe_router_load_balancing_type = {"aux_loss", "sinkhorn"};
  rejects(c, 1, "sinkhorn balances the routing by itself");
  c.moe.moe_router_load_balancing_type = {"aux_loss", "global_aux_loss"};
  c.moe.moe_aux_loss_coeff = {1e-2, -1.0};
  rejects(c, 1, "--moe-aux-loss-coeff must be >= 0");
  c.moe.moe_aux_loss_coeff = {};
  rejects(c, 1, "--moe-aux-loss-coeff needs a value");
  c.moe.moe_aux_loss_coeff = {1e-2, 0.0};
  c.moe.moe_expert_capacity_factor = 1.0;
  accepts(c, 1);  // (capacity: every type of the list one that allows it)
  CHECK(c.moe.aux_loss_coeff("aux_loss") == 1e-2);
  CHECK(c.moe.aux_loss_coeff("global_aux_loss") == 0.0);
  CHECK(c.moe.aux_loss_coeff("seq_aux_loss") == 0.0);
  c.moe.moe_router_load_balancing_type = {"none"};
  c.moe.moe_aux_loss_coeff = {1e-2};
  CHECK(c.moe.aux_loss_coeff("aux_loss") == 0.0);  // (Megatron's get_aux_loss_coeff: only the chosen type's)
  CHECK(c.moe.aux_loss_coeff("none") == 0.0);      // (and only of the three auxiliary losses)
  c.moe.moe_router_load_balancing_type = {"none", "aux_loss"};
  c.moe.moe_aux_loss_coeff = {0.5, 0.0};
  CHECK(c.moe.aux_loss_coeff("none") == 0.0);
  CHECK(c.moe.aux_loss_coeff("aux_loss") == 0.0);
}

TEST_CASE("selective recompute's modules (Megatron's checks) and --moe-layer-recompute") {
  Config c = base();
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"core_attn", "mlp", "moe", "layernorm"};
  accepts(c, 1);
  c.recompute.recompute_modules = {"attention"};
  rejects(c, 1, "unknown module 'attention'");
  c.recompute.recompute_modules = {"moe_act"};
  rejects(c, 1, "moe_act needs --moe-grouped-gemm");
  {  // (Megatron: "Delayed scaling does not support moe_act and layernorm recompute for fp8")
    Config d = c;
    d.moe.moe_grouped_gemm = true;
    d.precision.fp8_format = "hybrid";
    d.precision.fp8_recipe = "delayed";
    rejects(d, 1, "Delayed scaling does not support moe_act and layernorm recompute for fp8");
  }
  c.moe.moe_grouped_gemm = true;
  accepts(c, 1);
  c.recompute.recompute_modules = {"mla_up_proj"};
  rejects(c, 1, "mla_up_proj needs --multi-latent-attention");
  c.recompute.recompute_modules = {"moe"};
  c.recompute.recompute_num_layers = 2;
  rejects(c, 1, "--recompute-num-layers with --recompute-granularity selective");
  c.recompute.recompute_num_layers.reset();
  c.recompute.recompute_modules = {"core_attn"};
  c.recompute.recompute_granularity.reset();
  c.recompute.moe_layer_recompute = true;
  const Diagnostics d = validate(c, 1, Purpose::kTrain);
  CHECK(d.ok());
  CHECK(has(d.warnings, "--moe-layer-recompute is deprecated"));
  resolve(c, 1);  // (Megatron's mapping: selective, moe among the modules)
  CHECK(c.recompute.recompute_granularity == std::optional<std::string>("selective"));
  CHECK(c.recompute.recomputes("moe"));
  CHECK(c.recompute.recomputes("core_attn"));
  CHECK_FALSE(c.recompute.recomputes("mlp"));
  Config full = base();
  full.recompute.moe_layer_recompute = true;
  full.recompute.recompute_granularity = "full";
  full.recompute.recompute_method = "uniform";
  full.recompute.recompute_num_layers = 1;
  rejects(full, 1, "--moe-layer-recompute with --recompute-granularity full");
  Config ignored = base();  // (modules without selective: Megatron ignores them; a warning here)
  ignored.recompute.recompute_modules = {"moe"};
  CHECK(has(validate(ignored, 1, Purpose::kTrain).warnings, "--recompute-modules has no effect without --recompute-granularity selective"));
}

TEST_CASE("quantile balancing's rules (Megatron's QB), each with its fix") {
  Config c = base();
  c.moe.num_experts = 4;
  c.moe.moe_router_load_balancing_type = {"quantile_balancing"};
  c.moe.moe_aux_loss_coeff = {0.0};
  accepts(c, 1);
  c.moe.moe_router_topk = 4;
  rejects(c, 1, "--moe-router-topk 4 must be below --num-experts 4");
  c.moe.moe_router_topk = 2;
  c.moe.moe_router_num_groups = 2;
  c.moe.moe_router_group_topk = 1;
  rejects(c, 1, "quantile_balancing does not support group-limited routing");
  c.moe.moe_router_num_groups.reset();
  c.moe.moe_router_group_topk.reset();
  c.moe.moe_router_score_function = "sigmoid";
  c.moe.moe_router_enable_expert_bias = true;
  rejects(c, 1, "drop --moe-router-enable-expert-bias");
  c.moe.moe_router_enable_expert_bias = false;
  c.moe.moe_router_quantile_balancing_ema = 1.5;
  rejects(c, 1, "--moe-router-quantile-balancing-ema must be in [0, 1]");
  c.moe.moe_router_quantile_balancing_ema = 0.9;
  accepts(c, 1);
  c.moe.num_experts = 5;
  c.moe.moe_router_topk = 1;
  rejects(c, 1, "divisible by --num-experts 5");
  c.moe.moe_expert_capacity_factor = 1.0;
  rejects(c, 1, "--moe-expert-capacity-factor works only with");
}

TEST_CASE("the flex dispatcher: megatrain's all-to-all under Megatron's checks") {
  Config c = base();
  c.moe.num_experts = 8;
  c.moe.moe_token_dispatcher_type = "flex";
  rejects(c, 1, "--moe-token-dispatcher-type flex with the deepep backend needs expert-TP x EP > 1");
  c.moe.moe_flex_dispatcher_backend = "hybridep";
  accepts(c, 1);
  c.moe.moe_flex_dispatcher_backend = "deepep";
  c.parallel.expert_model_parallel_size = 2;
  accepts(c, 2);
  c.moe.moe_expert_capacity_factor = 1.0;
  c.moe.moe_pad_expert_input_to_capacity = true;
  rejects(c, 2, "--moe-token-dispatcher-type flex with the deepep backend does not take --moe-pad-expert-input-to-capacity");
  c.moe.moe_flex_dispatcher_backend = "hybridep";
  accepts(c, 2);
  c.moe.moe_enable_deepep = true;  // (the deprecated switch: the deepep backend)
  rejects(c, 2, "--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: give one backend");
  c.moe.moe_flex_dispatcher_backend = "deepep";
  rejects(c, 2, "does not take --moe-pad-expert-input-to-capacity");
  c.moe.moe_pad_expert_input_to_capacity = false;
  accepts(c, 2);
  c.moe.moe_token_dispatcher_type = "alltoall";
  rejects(c, 2, "--moe-enable-deepep needs --moe-token-dispatcher-type flex");
  c.moe.moe_enable_deepep = false;
  c.moe.moe_flex_dispatcher_backend = "ncclep";
  rejects(c, 2, "--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type flex");
  c.moe.moe_token_dispatcher_type = "flex";
  rejects(c, 2, "--moe-token-dispatcher-type flex with the ncclep backend does not take a capacity");
  c.moe.moe_expert_capacity_factor.reset();
  accepts(c, 2);
  c.moe.moe_shared_expert_intermediate_size = 64;
  c.model.disable_bias_linear = true;
  c.moe.moe_shared_expert_overlap = true;
  accepts(c, 2);
  c.moe.moe_token_dispatcher_type = "allgather";
  rejects(c, 2, "--moe-shared-expert-overlap works only with --moe-token-dispatcher-type alltoall or flex");
}

TEST_CASE("Megatron's MoE rules, each named with its fix") {
  Config c = base();
  c.moe.num_experts = 8;
  c.parallel.tensor_model_parallel_size = 2;
  rejects(c, 2, "needs --sequence-parallel");
  rejects(c, 2, "experts with biases need --expert-tensor-parallel-size 1");
  Config d = base();
  d.moe.num_experts = 8;
  d.moe.moe_expert_capacity_factor = 1.0;
  accepts(d, 1);  // (either dispatcher: Megatron no longer ties capacity to alltoall)
  d.moe.moe_token_dispatcher_type = "alltoall";
  accepts(d, 1);
  d.moe.moe_router_load_balancing_type = {"global_aux_loss"};
  accepts(d, 1);
  d.moe.moe_router_load_balancing_type = {"sinkhorn"};
  d.moe.moe_aux_loss_coeff = {0};
  rejects(d, 1, "aux_loss, seq_aux_loss, global_aux_loss or none");
  d.moe.moe_router_load_balancing_type = {"aux_loss"};
  d.moe.moe_expert_capacity_factor = 0.0;
  rejects(d, 1, "would drop every token");
  d.moe.moe_expert_capacity_factor = -1.0;  // (Megatron's dropless: None)
  d.moe.moe_pad_expert_input_to_capacity = true;
  rejects(d, 1, "needs --moe-expert-capacity-factor");
  d.moe.moe_pad_expert_input_to_capacity = false;
  accepts(d, 1);
  resolve(d, 1);
  CHECK_FALSE(d.moe.moe_expert_capacity_factor.has_value());
  Config t = base();  // (top-1 softmax after the choice: Megatron's "Please use --moe-router-pre-softmax when topk is 1")
  t.moe.num_experts = 8;
  t.moe.moe_router_topk = 1;
  rejects(t, 1, "add --moe-router-pre-softmax");
  t.moe.moe_router_pre_softmax = true;
  accepts(t, 1);
  t.moe.moe_router_pre_softmax = false;
  t.moe.moe_router_score_function = "sigmoid";
  accepts(t, 1);
  Config e = base();
  e.moe.num_experts = 8;
  e.moe.moe_pad_expert_input_to_capacity = true;
  rejects(e, 1, "needs --moe-expert-capacity-factor");
  e.moe.moe_pad_expert_input_to_capacity = false;
  e.moe.moe_router_num_groups = 3;
  e.moe.moe_router_group_topk = 1;
  rejects(e, 1, "--num-experts 8 is not divisible by --moe-router-num-groups 3");
  e.moe.moe_router_num_groups = 4;
  e.moe.moe_router_group_topk = 1;
  e.moe.moe_router_topk = 4;
  rejects(e, 1, "at most the experts per group (2)");
  e.moe.moe_router_topk = 2;
  accepts(e, 1);
  e.moe.moe_router_enable_expert_bias = true;
  rejects(e, 1, "supports only --moe-router-score-function sigmoid");
  e.moe.moe_router_score_function = "sigmoid";
  accepts(e, 1);
  e.moe.moe_layer_freq = "[0]+[1]*2";
  rejects(e, 1, "lists 3 layers, but --num-layers is");
  Config f = base();
  f.moe.num_experts = 8;
  f.moe.moe_shared_expert_intermediate_size = 64;
  rejects(f, 1, "shared experts have no biases");
}

TEST_CASE("layers divisible by PP, or uneven first/last stages") {
  Config c = base();
  c.model.num_layers = 10;
  c.parallel.pipeline_model_parallel_size = 4;
  rejects(c, 4, "--num-layers 10 is not divisible by PP(4)");
  c.parallel.decoder_first_pipeline_num_layers = 2;
  c.parallel.decoder_last_pipeline_num_layers = 2;
  accepts(c, 4);  // 2 + 3 + 3 + 2
  c.parallel.decoder_last_pipeline_num_layers = 3;
  rejects(c, 4, "the 5 layers between the first and last pipeline stages do not divide over the 2 middle stages");
  c.parallel.decoder_first_pipeline_num_layers = 8;
  rejects(c, 4, "first/last pipeline stages hold more layers");
  Config d = base();
  d.parallel.decoder_first_pipeline_num_layers = 2;
  rejects(d, 1, "need pipeline parallelism");
}

TEST_CASE("virtual pipeline stages") {
  Config c = base();
  c.parallel.pipeline_model_parallel_size = 2;
  c.training.global_batch_size = 8;
  c.parallel.num_layers_per_virtual_pipeline_stage = 3;
  rejects(c, 2, "layers per pipeline stage (8/2 = 4) is not divisible by --num-layers-per-virtual-pipeline-stage 3");
  c.parallel.num_layers_per_virtual_pipeline_stage = 2;
  accepts(c, 2);
  c.training.global_batch_size = 6;  // 3 microbatches, not divisible by PP 2
  rejects(c, 2, "interleaved pipelining needs the number of microbatches (3) divisible by PP(2)");
  Config d = base();
  d.parallel.num_virtual_stages_per_pipeline_rank = 2;
  rejects(d, 1, "interleaved pipelining (2 virtual stages) needs --pipeline-model-parallel-size > 1");
  d.parallel.num_layers_per_virtual_pipeline_stage = 2;
  rejects(d, 1, "give only one of");
}

TEST_CASE("heads, query groups and hidden size against TP") {
  Config c = base();
  c.parallel.tensor_model_parallel_size = 3;
  rejects(c, 3, "--num-attention-heads 8 is not divisible by TP(3)");
  Config g = base();
  g.model.group_query_attention = true;
  g.model.num_query_groups = 2;
  g.parallel.tensor_model_parallel_size = 4;
  accepts(g, 4);  // TP divisible by groups: K/V replicated
  g.model.num_query_groups = 8;
  accepts(g, 4);
  g.model.num_attention_heads = 12;
  g.model.hidden_size = 384;
  g.model.num_query_groups = 6;
  rejects(g, 4, "--num-query-groups 6 and TP(4) must divide one another");
  Config h = base();
  h.model.hidden_size = 250;
  rejects(h, 1, "--hidden-size 250 is not divisible by --num-attention-heads 8");
  h.model.kv_channels = 32;
  accepts(h, 1);
}

TEST_CASE("global batch divisible by micro batch x DP") {
  Config c = base();
  c.training.global_batch_size = 12;
  rejects(c, 4, "--global-batch-size 12 is not divisible by micro-batch-size(2) x DP(4) = 8");
  c.training.global_batch_size = 16;
  accepts(c, 4);
}

TEST_CASE("sequence length with CP and position embeddings") {
  Config c = base();
  c.parallel.context_parallel_size = 3;
  rejects(c, 3, "--seq-length 512 is not divisible by 2 x CP(3) = 6");
  c.parallel.context_parallel_size = 2;
  accepts(c, 2);
  Config d = base();
  d.model.max_position_embeddings = 256;
  rejects(d, 1, "--max-position-embeddings 256 is smaller than --seq-length 512");
}

TEST_CASE("sequence parallel without TP is a warning") {
  Config c = base();
  c.parallel.sequence_parallel = true;
  Diagnostics d = validate(c, 1, Purpose::kTrain);
  CHECK(d.ok());
  CHECK(has(d.warnings, "--sequence-parallel has no effect without tensor parallelism"));
  c.parallel.tensor_model_parallel_size = 2;
  d = validate(c, 2, Purpose::kTrain);
  CHECK(d.warnings.empty());
}

TEST_CASE("exclusive and dependent flags") {
  Config c = base();
  c.precision.fp16 = c.precision.bf16 = true;
  rejects(c, 1, "--fp16 and --bf16 are exclusive");
  Config o = base();
  o.training.overlap_param_gather = true;
  rejects(o, 1, "--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce");
  o.training.use_distributed_optimizer = o.training.overlap_grad_reduce = true;
  accepts(o, 1);
  Config s = base();
  s.checkpoint.save = "ckpt";
  rejects(s, 1, "--save needs --save-interval > 0");
  s.checkpoint.save_interval = 0;
  rejects(s, 1, "--save needs --save-interval > 0, got 0");
  s.checkpoint.save_interval = 100;
  accepts(s, 1);
  // Megatron's --save-retain-interval: positive, a multiple of --save-interval; not beside --ckpt-keep-last
  s.checkpoint.save_retain_interval = 500;
  accepts(s, 1);
  s.checkpoint.save_retain_interval = 250;
  rejects(s, 1, "--save-retain-interval 250 is not a multiple of --save-interval 100 (as Megatron requires): use a multiple, e.g. 300");
  s.checkpoint.save_retain_interval = 0;
  rejects(s, 1, "--save-retain-interval must be positive, got 0");
  s.checkpoint.save_retain_interval = 1000;
  s.checkpoint.ckpt_keep_last = 3;
  rejects(s, 1, "--save-retain-interval and --ckpt-keep-last both choose which checkpoints to delete");
  s.checkpoint.save_retain_interval.reset();
  accepts(s, 1);
  s.checkpoint.ckpt_keep_last = -1;
  rejects(s, 1, "--ckpt-keep-last must be 0 (keep all) or positive, got -1");
  Config t = base();
  t.training.train_samples = 100;
  rejects(t, 1, "--train-iters and --train-samples are exclusive");
  t.training.train_iters.reset();
  accepts(t, 1);
  Config w = base();
  w.training.lr_warmup_fraction = 0.1;
  w.training.lr_warmup_iters = 10;
  rejects(w, 1, "--lr-warmup-fraction and --lr-warmup-iters are exclusive");
}

TEST_CASE("recompute flags depend on each other") {
  Config c = base();
  c.recompute.recompute_granularity = "full";
  rejects(c, 1, "--recompute-granularity full needs --recompute-method");
  c.recompute.recompute_method = "uniform";
  rejects(c, 1, "--recompute-method uniform needs --recompute-num-layers");
  c.recompute.recompute_num_layers = 1;
  accepts(c, 1);
  Config s = base();
  s.recompute.recompute_method = "block";
  s.recompute.recompute_num_layers = 1;
  rejects(s, 1, "--recompute-method block needs --recompute-granularity full");
}

TEST_CASE("training needs a schedule, a learning rate and one data source") {
  Config c = base();
  c.training.train_iters.reset();
  c.training.lr.reset();
  c.data.mock_data = false;
  const Diagnostics d = validate(c, 1, Purpose::kTrain);
  CHECK(has(d.errors, "give --train-iters"));
  CHECK(has(d.errors, "--lr is required"));
  CHECK(has(d.errors, "no training data"));
  CHECK(validate(c, 1, Purpose::kPlan).ok());  // planning needs none of these
  c.data.mock_data = true;
  c.data.text_data_path = "x.txt";
  rejects(c, 1, "give one data source");
}

TEST_CASE("every violation is reported at once, required flags named") {
  Config c;
  c.parallel.tensor_model_parallel_size = 4;
  const Diagnostics d = validate(c, 6, Purpose::kTrain);
  CHECK(has(d.errors, "--num-layers is required"));
  CHECK(has(d.errors, "--hidden-size is required"));
  CHECK(has(d.errors, "--micro-batch-size is required"));
  CHECK(has(d.errors, "world size 6 is not divisible by TP(4)"));
  CHECK(d.errors.size() >= 8);
}

TEST_CASE("--step-batch-size-schedule: Megatron's rules") {
  Config c = base();
  c.training.global_batch_size.reset();
  c.training.train_iters.reset();
  c.training.train_samples = 1000;
  c.training.step_batch_size_schedule = "0:8 1K:16";
  accepts(c, 2);
  Config both = c;
  both.training.global_batch_size = 16;
  rejects(both, 2, "Cannot specify both --step-batch-size-schedule and --global-batch-size");
  Config ramp = c;
  ramp.training.rampup_batch_size = {"8", "8", "300"};
  rejects(ramp, 2, "--step-batch-size-schedule with --rampup-batch-size: give one of them");
  Config bad = c;
  bad.training.step_batch_size_schedule = "1K:8";
  rejects(bad, 2, "--step-batch-size-schedule: the first threshold must be 0");
  Config interleaved = c;  // (evaluation takes micro batch x DP samples: one microbatch, which interleaving cannot split)
  interleaved.parallel.pipeline_model_parallel_size = 2;
  interleaved.parallel.num_virtual_stages_per_pipeline_rank = 2;
  interleaved.model.num_layers = 4;
  interleaved.logging.eval_iters = 2;
  rejects(interleaved, 4, "--step-batch-size-schedule with interleaved pipelining: evaluation takes micro-batch x DP samples");
  Config iters = c;
  iters.training.train_samples.reset();
  iters.training.train_iters = 10;
  CHECK(has(validate(iters, 2, Purpose::kTrain).warnings, "counts an iteration as micro-batch x DP samples"));
}

TEST_CASE("--rampup-batch-size: Megatron's rules, every batch size in whole microbatches") {
  Config c = base();
  c.training.train_iters.reset();
  c.training.train_samples = 1000;
  c.training.global_batch_size = 32;
  c.training.rampup_batch_size = {"8", "8", "300"};
  accepts(c, 2);  // micro batch 2 x DP 2 = 4 divides 8
  // The base run with one change, then with the ramp given as `ramp`.
  auto with = [&](auto change, std::vector<std::string> ramp = {"8", "8", "300"}) {
    Config v = c;
    change(v);
    v.training.rampup_batch_size = std::move(ramp);
    return v;
  };
  const auto same = [](Config&) {};
  rejects(with([](Config& v) { v.training.train_samples.reset(), v.training.train_iters = 10; }), 2, "--rampup-batch-size needs --train-samples");
  rejects(with([](Config& v) { v.training.lr_warmup_iters = 5; }), 2, "use --lr-decay-samples / --lr-warmup-samples");
  rejects(with([](Config& v) { v.training.global_batch_size.reset(); }), 2, "--rampup-batch-size needs --global-batch-size");
  rejects(with(same, {"8", "10", "300"}), 2, "must be the start 8 plus a whole number of increments of 10");
  rejects(with(same), 8, "must be multiples of micro-batch-size x DP = 16");
  rejects(with(same, {"8", "eight", "300"}), 2, "takes 3 integers");
  rejects(with(same, {"0", "8", "300"}), 2, "positive start, increment and sample count");
  rejects(with(same, {"8", "8", "0"}), 2, "positive start, increment and sample count");
}

TEST_CASE("--deterministic-mode: NCCL_ALGO only where each token has a fixed reduction order (Megatron's rule)") {
  Config c = base();
  c.training.deterministic_mode = true;
  const char* before = std::getenv("NCCL_ALGO");
  const std::string saved = before ? before : "";
  unsetenv("NCCL_ALGO");
  accepts(c, 2);  // (unset: megatrain sets Ring)
  for (const char* good : {"Ring", "Ring,CollnetDirect", " ^NVLS ", "CollnetChain"}) {
    setenv("NCCL_ALGO", good, 1);
    accepts(c, 2);
  }
  for (const char* bad : {"Tree", "Ring,Tree", "ring", ",", "NVLS"}) {
    setenv("NCCL_ALGO", bad, 1);
    rejects(c, 2, "is not a deterministic setting");
  }
  c.training.deterministic_mode = false;
  accepts(c, 2);  // (Tree is NCCL's business without the flag)
  if (before) setenv("NCCL_ALGO", saved.c_str(), 1);
  else unsetenv("NCCL_ALGO");
}

TEST_CASE("--microbatch-group-size-per-virtual-pipeline-stage: Megatron's range and last group") {
  Config c = base();
  c.model.num_layers = 8;
  c.parallel.pipeline_model_parallel_size = 2;
  c.training.global_batch_size = 10;
  c.parallel.microbatch_group_size_per_vp_stage = 1;  // (without interleaving the group size is not used, as Megatron)
  accepts(c, 2);
  c.parallel.microbatch_group_size_per_vp_stage.reset();
  c.parallel.num_virtual_stages_per_pipeline_rank = 2;
  c.training.global_batch_size = 10;  // 5 microbatches of 2 on PP 2 (DP 1)
  rejects(c, 2, "interleaved pipelining needs the number of microbatches (5) divisible by PP(2)");  // (groups of PP)
  c.parallel.microbatch_group_size_per_vp_stage = 3;  // Megatron's example: 0 1 2 | 3 4
  accepts(c, 2);
  c.parallel.microbatch_group_size_per_vp_stage = 4;  // a last group of 1 < PP
  rejects(c, 2, "leave a last group of 1 with --microbatch-group-size-per-virtual-pipeline-stage 4, fewer than PP(2)");
  c.parallel.microbatch_group_size_per_vp_stage = 6;
  rejects(c, 2, "--microbatch-group-size-per-virtual-pipeline-stage 6 is more than the microbatches (5");
  c.parallel.microbatch_group_size_per_vp_stage = 1;
  rejects(c, 2, "--microbatch-group-size-per-virtual-pipeline-stage 1 is less than PP(2)");
  c.parallel.microbatch_group_size_per_vp_stage = 5;
  accepts(c, 2);
  c.logging.eval_iters = 1;
  c.training.eval_global_batch_size = 8;  // the evaluation's 4 microbatches cannot hold a group of 5
  rejects(c, 2, "--microbatch-group-size-per-virtual-pipeline-stage 5 is more than the evaluation's microbatches (4");
}

TEST_CASE("--pipeline-model-parallel-layout: Megatron's string, its checks, the stages it sets") {
  // Megatron's docstring example: "Ettt|(tt|)*29,m|L" is [E t t t] + [t t] x 29 + [m] + [L].
  const std::vector<PipelineLayoutStage> parsed = parse_pipeline_layout("Ettt|(tt|)*29,m|L");
  REQUIRE(parsed.size() == 32);
  CHECK(parsed.front().layers == "Ettt");
  CHECK(parsed[29].layers == "tt");
  CHECK(parsed[30].layers == "m");
  CHECK(parsed.back().layers == "L");
  const std::vector<PipelineLayoutStage> leading = parse_pipeline_layout("(|Et)*2,tL");  // "|Et|Et" + "tL": ["", "Et", "EttL"]
  REQUIRE(leading.size() == 3);
  CHECK(leading[0].empty());
  CHECK(leading[2].layers == "EttL");
  CHECK(parse_pipeline_layout("Et*3|t*2L")[0].layers == "Ettt");
  CHECK_THROWS_AS(parse_pipeline_layout("Ex|L"), ConfigError);
  Config c = base();
  c.model.num_layers = 6;
  c.parallel.pipeline_model_parallel_size = 2;
  c.training.global_batch_size = 8;
  c.parallel.pipeline_model_parallel_layout = "Et|tt|tt|tL";  // 4 stages: 2 virtual stages per rank
  accepts(c, 2);
  resolve(c, 2);
  CHECK(virtual_stages_per_rank(c) == 2);
  CHECK(layers_per_virtual_stage(c) == std::vector<int64_t>{1, 2, 2, 1});
  CHECK(c.derived.layers_per_stage == std::vector<int64_t>{3, 3});
  c.parallel.pipeline_model_parallel_layout = "Etttttt|L";  // the loss alone on the last stage
  accepts(c, 2);
  c.parallel.pipeline_model_parallel_layout = "Ett|tt|ttL";
  rejects(c, 2, "its 3 stages are not divisible by --pipeline-model-parallel-size 2");
  c.parallel.pipeline_model_parallel_layout = "tEtt|tttL";
  rejects(c, 2, "the first layer must be the embedding E");
  c.parallel.pipeline_model_parallel_layout = "Ettt|ttLt";
  rejects(c, 2, "the last layer must be the loss L");
  c.parallel.pipeline_model_parallel_layout = "Ettt|ttL";
  rejects(c, 2, "it holds 5 transformer layers (t), --num-layers is 6");
  c.parallel.pipeline_model_parallel_layout = "Ettt|tttmL";
  rejects(c, 2, "it holds 1 multi-token prediction layers (m), --mtp-num-layers is 0");
  c.parallel.pipeline_model_parallel_layout = "Ettt|ttt||L";
  rejects(c, 2, "1 stage(s) hold nothing");
  c.parallel.pipeline_model_parallel_layout = "Ettt|tttL";
  c.parallel.num_virtual_stages_per_pipeline_rank = 2;
  rejects(c, 2, "--pipeline-model-parallel-layout sets the virtual stages itself");
  c.parallel.num_virtual_stages_per_pipeline_rank.reset();
  c.parallel.decoder_first_pipeline_num_layers = 3;
  rejects(c, 2, "cannot be combined with --decoder-first/last-pipeline-num-layers");
}

TEST_CASE("--num-distributed-optimizer-instances: with the distributed optimizer, a divisor of DP x CP and of expert-DP") {
  Config c = base();
  c.training.num_distributed_optimizer_instances = 2;
  rejects(c, 4, "--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer");
  c.training.use_distributed_optimizer = true;
  accepts(c, 4);
  rejects(c, 3, "DP x CP (3) is not divisible by --num-distributed-optimizer-instances 2");
  c.precision.ddp_reduce_scatter_with_fp32_accumulation = true;
  rejects(c, 4, "--ddp-reduce-scatter-with-fp32-accumulation with --num-distributed-optimizer-instances > 1");
  c.precision.ddp_reduce_scatter_with_fp32_accumulation = false;
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.parallel.expert_model_parallel_size = 4;  // (the experts' DP: 4 / 4 = 1, not divisible by 2)
  rejects(c, 4, "the experts' data-parallel size (1) is not divisible by --num-distributed-optimizer-instances 2");
}

TEST_CASE("--quick-geglu, --glu-linear-offset and --activation-func-clamp-value: Megatron's rules") {
  Config q = base();
  q.model.quick_geglu = true;
  q.model.glu_linear_offset = 1.0;
  q.model.activation_func_clamp_value = 7.0;
  accepts(q, 1);  // (GPT-OSS's: a dense model may clamp its quick GeGLU)
  Config resolved = q;
  resolve(resolved, 1);
  CHECK(*resolved.model.ffn_hidden_size == 4 * 256);  // (Megatron's default 4h: the 2/3 rule is --swiglu's)
  Config both = q;
  both.model.swiglu = true;
  rejects(both, 1, "--quick-geglu and --swiglu are two activations");
  Config relu = q;
  relu.model.squared_relu = true;
  rejects(relu, 1, "--quick-geglu and --squared-relu are two activations");
  Config zero = q;
  zero.model.activation_func_clamp_value = 0.0;
  rejects(zero, 1, "--activation-func-clamp-value must be a finite number greater than zero");
  Config swiglu = base();
  swiglu.model.swiglu = true;
  swiglu.model.activation_func_clamp_value = 7.0;
  rejects(swiglu, 1, "--activation-func-clamp-value with --swiglu needs MoE");
  swiglu.moe.num_experts = 4;
  accepts(swiglu, 1);
  swiglu.model.glu_linear_offset = 1.0;
  rejects(swiglu, 1, "--activation-func-clamp-value with --swiglu needs --glu-linear-offset 0");
}
