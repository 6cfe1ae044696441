// test_flags.cpp: the flag table through CLI11, YAML recipes and --print-config.
#include <CLI/CLI.hpp>

#include "catch.h"
#include "config/cli.h"
#include "config/errors.h"
#include "config/flags.h"
#include "config/resolve.h"
#include "config/yaml_io.h"

using namespace mt;

namespace {

Config parse_cli(const std::string& line) {
  CLI::App app;
  ConfigCli cli(app);
  app.parse(line, false);
  return cli.build();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A value for every flag that differs from its default.
Config all_flags_changed() {
  Config c;
  const Config dflt;
  for (const auto& spec : flag_table()) {
    std::string v;
    if (!spec.choices.empty()) {
      v = spec.choices.back() == flag_value_text(dflt, spec) ? spec.choices.front() : spec.choices.back();
    } else if (flag_is_bool(spec)) {
      v = flag_value_text(dflt, spec) == "true" ? "false" : "true";
    } else if (std::string(flag_type_name(spec)) == "INT") {
      v = "7";
    } else if (std::string(flag_type_name(spec)) == "FLOAT") {
      v = flag_is_list(spec) ? "0.000123456789 0.5" : "0.000123456789";
    } else if (flag_is_list(spec)) {
      v = "0.3 path/a 0.7 path/b";
    } else {
      v = "some value: with # specials";
    }
    set_flag_from_string(c, spec, v, "test");
  }
  return c;
}

}  // namespace

TEST_CASE("every flag of REFERENCE.md section 1 is in the table and in --help") {
  const std::vector<std::string> reference = {
      "num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size", "kv-channels", "group-query-attention",
      "num-query-groups", "swiglu", "normalization", "norm-epsilon", "position-embedding-type", "rotary-base",
      "rotary-percent", "max-position-embeddings", "untie-embeddings-and-output-weights", "disable-bias-linear",
      "make-vocab-size-divisible-by", "hidden-dropout", "attention-dropout", "init-method-std", "transformer-impl",
      "attention-backend", "use-flash-attn", "use-mcore-models", "apply-query-key-layer-scaling", "qk-layernorm",
      "vocab-size", "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
      "expert-model-parallel-size", "expert-tensor-parallel-size", "sequence-parallel",
      "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
      "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "cp-comm-type", "use-tp-pp-dp-mapping",
      "distributed-backend", "micro-batch-size", "global-batch-size", "rampup-batch-size", "train-iters",
      "train-samples", "optimizer", "lr", "min-lr", "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps",
      "lr-decay-style", "lr-decay-iters", "lr-warmup-iters", "lr-warmup-fraction", "lr-warmup-init",
      "use-distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather", "ddp-bucket-size", "seed",
      "optimizer-cpu-offload", "cpu-optimizer", "cpu-optimizer-type", "bf16", "fp16", "loss-scale",
      "initial-loss-scale", "fp8-format", "fp8-recipe", "fp8-amax-history-len", "fp8-amax-compute-algo", "fp8-hybrid",
      "grad-reduce-in-bf16", "recompute-activations", "recompute-granularity", "recompute-method",
      "recompute-num-layers", "recompute-modules", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
      "moe-layer-freq", "moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-z-loss-coeff",
      "moe-token-dispatcher-type", "moe-grouped-gemm", "moe-expert-capacity-factor", "moe-router-pre-softmax",
      "moe-shared-expert-intermediate-size", "data-path", "split", "train-data-path", "valid-data-path",
      "test-data-path", "mock-data", "seq-length", "data-cache-path", "num-workers", "dataloader-type", "eod-mask-loss",
      "reset-position-ids", "reset-attention-mask", "tokenizer-type", "vocab-file", "merge-file", "tokenizer-model",
      "save", "load", "save-interval", "no-save-optim", "no-save-rng", "no-load-optim", "no-load-rng", "finetune",
      "ckpt-format", "async-save", "use-checkpoint-args", "log-interval", "log-throughput", "log-params-norm",
      "tensorboard-dir", "wandb-project", "eval-interval", "eval-iters", "timing-log-level", "profile", "yaml-cfg"};
  CLI::App app;
  ConfigCli cli(app);
  const std::string help = app.help();
  for (const auto& name : reference) {
    INFO(name);
    const bool listed = help.find("--" + name + " ") != std::string::npos || help.find("--" + name + "\n") != std::string::npos ||
                        help.find("--" + name + ",") != std::string::npos;
    CHECK(listed);
    if (name != "yaml-cfg") CHECK((find_flag(name) != nullptr || find_alias(name) != nullptr));
  }
}

TEST_CASE("defaults are Megatron's") {
  Config c;
  CHECK(c.model.normalization == "LayerNorm");
  CHECK(c.model.norm_epsilon == 1e-5);
  CHECK(c.model.make_vocab_size_divisible_by == 128);
  CHECK(c.model.hidden_dropout == 0.1);
  CHECK(c.training.weight_decay == 0.01);
  CHECK(c.training.adam_beta2 == 0.999);
  CHECK(c.training.lr_decay_style == "linear");
  CHECK(c.training.seed == 1234);
  CHECK(c.precision.initial_loss_scale == 4294967296.0);
  CHECK(c.moe.moe_router_topk == 2);
  CHECK(c.logging.log_interval == 100);
  CHECK(c.logging.eval_iters == 100);
}

TEST_CASE("every flag round-trips through --print-config") {
  Config c = all_flags_changed();
  const std::string yaml = config_to_yaml(c);
  Config back;
  apply_yaml_text(back, yaml, "printed");
  for (const auto& spec : flag_table()) {
    INFO(spec.name);
    CHECK(flag_value_text(back, spec) == flag_value_text(c, spec));
  }
  // A resolved default config round-trips too (null optionals stay null).
  Config d;
  d.model.hidden_size = 64;
  d.model.num_attention_heads = 4;
  resolve(d, 1);
  Config d2;
  apply_yaml_text(d2, config_to_yaml(d), "printed");
  for (const auto& spec : flag_table()) CHECK(flag_value_text(d2, spec) == flag_value_text(d, spec));
}

TEST_CASE("precedence: defaults < YAML < command line") {
  const std::string path = std::string(MEGATRAIN_SOURCE_DIR) + "/configs/gpt2-124m.yaml";
  Config c = parse_cli("--config " + path + " --hidden-size 1024 --lr 1e-3");
  CHECK(*c.model.num_layers == 12);      // YAML
  CHECK(*c.model.hidden_size == 1024);   // command line over YAML
  CHECK(*c.training.lr == 1e-3);
  CHECK(c.model.init_method_std == 0.02);
  CHECK(c.training.adam_eps == 1e-8);    // default
  Config y = parse_cli("--yaml-cfg " + path);
  CHECK(*y.model.hidden_size == 768);
}

TEST_CASE("YAML: dashes or underscores, nested sections, lists, null") {
  Config c;
  apply_yaml_text(c,
                  "num-layers: 4\nhidden_size: 64\nmodel:\n  num_attention_heads: 8\n  deeper:\n    swiglu: true\n"
                  "data_path: [0.3, a, 0.7, b]\nffn_hidden_size: null\nrecompute-modules: [core_attn, mlp]\n",
                  "t.yaml");
  CHECK(*c.model.num_layers == 4);
  CHECK(*c.model.hidden_size == 64);
  CHECK(*c.model.num_attention_heads == 8);
  CHECK(c.model.swiglu);
  CHECK(c.data.data_path == StringList{"0.3", "a", "0.7", "b"});
  CHECK(!c.model.ffn_hidden_size);
  CHECK(c.recompute.recompute_modules.size() == 2);
}

TEST_CASE("unknown flags and keys name the nearest valid one") {
  CHECK(error_of([] { parse_cli("--num-layrs 2"); }) == "unknown flag --num-layrs: did you mean --num-layers? (megatrain --help lists all flags)");
  CHECK(error_of([] { parse_cli("--hidden_size 2"); }).find("did you mean --hidden-size") != std::string::npos);
  // Megatron's inference and RL flags are named as such, not matched to a training flag
  CHECK(error_of([] { parse_cli("--max-tokens-to-oom 3600"); }) ==
        "--max-tokens-to-oom is one of Megatron-LM's text-generation / inference settings: megatrain pretrains models and has no inference "
        "engine or RL loop: drop it");
  CHECK(error_of([] { parse_cli("--inference-dynamic-batching-buffer-size-gb 20"); }).find("inference-engine settings") != std::string::npos);
  CHECK(error_of([] { parse_cli("--grpo-group-size 4"); }).find("reinforcement-learning (GRPO) settings") != std::string::npos);
  // Families of Megatron features megatrain does not have, by their flags' prefixes
  CHECK(error_of([] { parse_cli("--dsa-indexer-n-heads 8"); }) == "--dsa-indexer-n-heads: DeepSeek sparse attention (DSA) is not implemented: drop its --dsa-* flags");
  CHECK(error_of([] { parse_cli("--linear-conv-kernel-dim 4"); }).find("gated delta net") != std::string::npos);
  CHECK(error_of([] { parse_cli("--error-injection-rate 0"); }).find("fault injection") != std::string::npos);
  CHECK(error_of([] { parse_cli("--hierarchical-context-parallel-sizes 2 2"); }).find("--cp-comm-type p2p or a2a") != std::string::npos);
  CHECK(error_of([] { parse_cli("--outer-dp-sharding-strategy optim"); }).find("Megatron FSDP") != std::string::npos);
  CHECK(error_of([] { parse_cli("--megatron-fsdp-main-params-dtype fp32"); }).find("Megatron FSDP") != std::string::npos);
  CHECK(error_of([] { parse_cli("--use-mup"); }).find("muP") != std::string::npos);
  CHECK(error_of([] { parse_cli("--fim-data"); }).find("fill-in-the-middle") != std::string::npos);
  CHECK(error_of([] { parse_cli("--export-te-mcore-model"); }).find("checkpoint export --hf") != std::string::npos);
  CHECK(error_of([] { parse_cli("--no-use-layer-wise-param-layout"); }).find("Muon") != std::string::npos);
  Config c;
  CHECK(error_of([&] { apply_yaml_text(c, "num_layer: 3\n", "r.yaml"); }) == "unknown key 'num_layer' in r.yaml: did you mean 'num_layers'?");
  CHECK(error_of([&] { apply_yaml_text(c, "model:\n  hiden-size: 3\n", "r.yaml"); })
            .find("did you mean 'hidden-size'") != std::string::npos);
}

TEST_CASE("wrong types name the key and the value") {
  Config c;
  CHECK(error_of([] { parse_cli("--num-layers twelve"); }) == "--num-layers (command line): expected an integer, got 'twelve'");
  CHECK(error_of([&] { apply_yaml_text(c, "lr: fast\n", "r.yaml"); }) == "--lr (r.yaml): expected a number, got 'fast'");
  CHECK(error_of([&] { apply_yaml_text(c, "bf16: maybe\n", "r.yaml"); }) == "--bf16 (r.yaml): expected true or false, got 'maybe'");
  CHECK(error_of([&] { apply_yaml_text(c, "normalization: BatchNorm\n", "r.yaml"); }) ==
        "--normalization (r.yaml): 'BatchNorm' is not one of LayerNorm, RMSNorm");
  CHECK(error_of([&] { apply_yaml_text(c, "num_layers: [1, 2]\n", "r.yaml"); }) == "--num-layers (r.yaml): takes one value, got 2");
  CHECK(error_of([&] { apply_yaml_text(c, "seed: null\n", "r.yaml"); }) == "--seed (r.yaml): needs a value, got null");
  CHECK(error_of([&] { apply_yaml_text(c, "a: [b\n", "bad.yaml"); }).rfind("bad.yaml: not valid YAML", 0) == 0);
  CHECK(error_of([&] { apply_yaml_file(c, "/nonexistent.yaml"); }).find("cannot read recipe '/nonexistent.yaml'") != std::string::npos);
  // Integral floats from YAML writers are integers.
  apply_yaml_text(c, "train_iters: 1e3\n", "r.yaml");
  CHECK(*c.training.train_iters == 1000);
}

TEST_CASE("old spellings are accepted, mapped and noted") {
  Config c = parse_cli("--use-mcore-models --fp8-hybrid --cpu-optimizer --cpu-optimizer-type adam --use-flash-attn "
                       "--recompute-activations");
  CHECK(*c.precision.fp8_format == "hybrid");
  CHECK(c.training.optimizer_cpu_offload);
  CHECK(c.training.optimizer == "adam");
  CHECK(c.model.attention_backend == "flash");
  CHECK(*c.recompute.recompute_granularity == "selective");
  REQUIRE(c.notes.size() == 6);
  CHECK(c.notes[0] == "note: --use-mcore-models is deprecated and has no effect");
  Config y;
  apply_yaml_text(y, "recompute_activations: true\nuse_flash_attn: false\n", "r.yaml");
  CHECK(*y.recompute.recompute_granularity == "selective");
  CHECK(y.model.attention_backend == "auto");
  CHECK(error_of([] { parse_cli("--cpu-optimizer-type lion"); }).find("--cpu-optimizer-type 'lion' is not known") == 0);
}

TEST_CASE("list flags accept Megatron's blend forms") {
  Config a = parse_cli("--data-path 0.3 a 0.7 b --split 98,2,0");
  CHECK(a.data.data_path == StringList{"0.3", "a", "0.7", "b"});
  Config b = parse_cli("--data-path \"0.3 a 0.7 b\"");
  CHECK(b.data.data_path == StringList{"0.3", "a", "0.7", "b"});
}

TEST_CASE("derived values: ffn with SwiGLU, kv-channels, padded vocab, microbatches") {
  CHECK(default_ffn_hidden_size(4096, false) == 16384);
  CHECK(default_ffn_hidden_size(4096, true) == 10880);  // int(4*4096*2/3/64)*64
  CHECK(default_ffn_hidden_size(2048, true) == 5440);
  CHECK(padded_vocab_size(50257, 128, 1) == 50304);
  CHECK(padded_vocab_size(50257, 128, 8) == 51200);
  CHECK(padded_vocab_size(128256, 128, 4) == 128512);
  Config c = parse_cli("--num-layers 4 --hidden-size 96 --num-attention-heads 6 --micro-batch-size 2 "
                       "--global-batch-size 16 --tensor-model-parallel-size 2 --vocab-size 1000 --swiglu");
  resolve(c, 8);
  CHECK(*c.model.kv_channels == 16);
  CHECK(*c.model.ffn_hidden_size == 256);
  CHECK(c.derived.data_parallel_size == 4);
  CHECK(c.derived.num_microbatches == 2);
  CHECK(c.derived.padded_vocab_size == 1024);
  CHECK(c.derived.num_query_groups == 6);
  CHECK(*c.parallel.expert_tensor_parallel_size == 2);
}
