// flag_aliases.cpp: the Megatron flags outside the flag table: old spellings mapped onto it, flags accepted with a
// note because megatrain's results do not depend on them, settings megatrain has at their default only, and those
// refused by name.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/errors.h"
#include "config/flags.h"

namespace mt {
namespace {

// A Megatron flag accepted with a note because megatrain's results do not depend on it, and one refused by name.
#define MT_INERT(NAME, VALUE, WHY)                                                                                    \
  AliasSpec {                                                                                                         \
    NAME, VALUE, "No effect here: " WHY, [](Config&, const std::string&) { return std::string("note: --" NAME " has no effect: " WHY); }, \
        "Megatron flags without effect here (accepted with a note)"                                                   \
  }
// The same for a flag of one or more values (Megatron's nargs='+').
#define MT_INERT_LIST(NAME, WHY)                                                                                      \
  AliasSpec {                                                                                                         \
    NAME, true, "No effect here: " WHY, [](Config&, const std::string&) { return std::string("note: --" NAME " has no effect: " WHY); }, \
        "Megatron flags without effect here (accepted with a note)", true                                             \
  }
#define MT_REFUSED_LIST(NAME, WHY)                                                                                    \
  AliasSpec {                                                                                                         \
    NAME, true, "Not supported: " WHY, [](Config&, const std::string&) -> std::string { throw ConfigError("--" NAME ": " WHY); }, \
        "Megatron flags not supported (refused by name)", true                                                        \
  }
#define MT_REFUSED(NAME, VALUE, WHY)                                                                                  \
  AliasSpec {                                                                                                         \
    NAME, VALUE, "Not supported: " WHY, [](Config&, const std::string&) -> std::string { throw ConfigError("--" NAME ": " WHY); }, \
        "Megatron flags not supported (refused by name)"                                                              \
  }

// A Megatron setting megatrain has at its default only: that value accepted with a note, any other refused by name.
#define MT_DEFAULT_ONLY(NAME, DEFAULT, WHY)                                                                            \
  AliasSpec {                                                                                                         \
    NAME, true, "Only " DEFAULT " (Megatron's default): " WHY,                                                        \
        [](Config&, const std::string& v) -> std::string {                                                            \
          if (v != DEFAULT) throw ConfigError("--" NAME " " + v + ": " WHY " (only " DEFAULT ", Megatron's default)"); \
          return std::string("note: --" NAME " " DEFAULT " is megatrain's only setting");                             \
        },                                                                                                            \
        "Megatron flags megatrain has at their default only"                                                          \
  }

int64_t parse_alias_int(const char* name, const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < 0) throw ConfigError(std::string("--") + name + ": expected a whole number >= 0, got '" + v + "'");
  return x;
}

std::vector<AliasSpec> build_aliases() {
  return {
      {"use-mcore-models", false, "Deprecated, no effect (megatrain has one model implementation)",
       [](Config&, const std::string&) {
         return std::string("note: --use-mcore-models is deprecated and has no effect");
       }},
      {"fp8-interval", true, "Deprecated in Megatron and ignored (the delayed scaling updates every microbatch)",
       [](Config&, const std::string&) { return std::string("note: --fp8-interval is deprecated (as in Megatron) and ignored"); }},
      {"fp8-hybrid", false, "Old spelling of --fp8-format hybrid",
       [](Config& c, const std::string&) {
         c.precision.fp8_format = "hybrid";
         return std::string("note: --fp8-hybrid is the old spelling of --fp8-format hybrid");
       }},
      {"cpu-optimizer", false, "Old spelling of --optimizer-cpu-offload",
       [](Config& c, const std::string&) {
         c.training.optimizer_cpu_offload = true;
         return std::string("note: --cpu-optimizer is the old spelling of --optimizer-cpu-offload");
       }},
      {"cpu-optimizer-type", true, "Old spelling: the CPU optimizer's type, now --optimizer with --optimizer-cpu-offload",
       [](Config& c, const std::string& v) {
         std::string t = v;
         std::transform(t.begin(), t.end(), t.begin(), ::tolower);
         if (t == "adam" || t == "adamw" || t == "hybridadam" || t == "cpuadam" || t == "torch_adam") {
           c.training.optimizer = "adam";
         } else if (t == "sgd") {
           c.training.optimizer = "sgd";
         } else {
           throw ConfigError("--cpu-optimizer-type '" + v + "' is not known: use --optimizer adam|sgd with --optimizer-cpu-offload");
         }
         c.training.optimizer_cpu_offload = true;
         return "note: --cpu-optimizer-type " + v + " is the old spelling of --optimizer " + c.training.optimizer +
                " --optimizer-cpu-offload";
       }},
      {"override-opt_param-scheduler", false, "Megatron's first spelling of --override-opt-param-scheduler",
       [](Config& c, const std::string&) {
         c.checkpoint.override_opt_param_scheduler = true;
         return std::string("note: --override-opt_param-scheduler is --override-opt-param-scheduler");
       }},
      {"use-checkpoint-opt_param-scheduler", false, "Megatron's first spelling of --use-checkpoint-opt-param-scheduler",
       [](Config& c, const std::string&) {
         c.checkpoint.use_checkpoint_opt_param_scheduler = true;
         return std::string("note: --use-checkpoint-opt_param-scheduler is --use-checkpoint-opt-param-scheduler");
       }},
      {"use-flash-attn", false, "Old spelling of --attention-backend flash",
       [](Config& c, const std::string&) {
         c.model.attention_backend = "flash";
         return std::string("note: --use-flash-attn is the old spelling of --attention-backend flash");
       }},
      {"no-weight-decay-cond-type", true, "Deprecated in Megatron: apply_wd_to_qk_layernorm is --apply-wd-to-qk-layernorm",
       [](Config& c, const std::string& v) {
         if (v != "apply_wd_to_qk_layernorm") {
           throw ConfigError("--no-weight-decay-cond-type " + v + ": its one value is apply_wd_to_qk_layernorm (Megatron: use --apply-wd-to-qk-layernorm)");
         }
         c.training.apply_wd_to_qk_layernorm = true;
         return std::string("note: --no-weight-decay-cond-type apply_wd_to_qk_layernorm is deprecated (as in Megatron): it is --apply-wd-to-qk-layernorm");
       }},
      {"encoder-num-layers", true, "Megatron's other name of --num-layers for GPT models",
       [](Config& c, const std::string& v) {
         const int64_t n = parse_alias_int("encoder-num-layers", v);
         if (c.model.num_layers && *c.model.num_layers != n) throw ConfigError("--encoder-num-layers " + v + " with another --num-layers: give one");
         c.model.num_layers = n;
         return std::string("note: --encoder-num-layers is --num-layers for a GPT model");
       }},
      {"encoder-seq-length", true, "Megatron's other name of --seq-length for GPT models",
       [](Config& c, const std::string& v) {
         const int64_t n = parse_alias_int("encoder-seq-length", v);
         if (c.data.seq_length && *c.data.seq_length != n) throw ConfigError("--encoder-seq-length " + v + " with another --seq-length: give one");
         c.data.seq_length = n;
         return std::string("note: --encoder-seq-length is --seq-length for a GPT model");
       }},
      // Deprecated in Megatron, which stops with these same directions.
      MT_REFUSED("batch-size", true, "no longer valid (as in Megatron): use --micro-batch-size"),
      MT_REFUSED("warmup", true, "no longer valid (as in Megatron): use --lr-warmup-fraction"),
      MT_REFUSED("model-parallel-size", true, "no longer valid (as in Megatron): use --tensor-model-parallel-size"),
      MT_REFUSED("checkpoint-activations", false,
                 "no longer valid (as in Megatron): use --recompute-activations, or --recompute-granularity and --recompute-method"),
      MT_REFUSED("decoder-seq-length", true, "it belongs to encoder-decoder models (T5); megatrain trains decoder-only GPT models"),
      MT_REFUSED("decoder-num-layers", true, "it belongs to encoder-decoder models (T5); megatrain trains decoder-only GPT models"),
      MT_REFUSED("fp16-lm-cross-entropy", false, "megatrain computes the loss in fp32 (a loss in fp16 is not implemented): drop it"),
      MT_REFUSED("dataloader-inter-document-masking", false,
                 "attention restricted by the dataset's document boundaries is not implemented: use --reset-attention-mask (documents "
                 "end at the end-of-document token: preprocess with --append-eod)"),
      {"recompute-activations", false, "Old spelling of --recompute-granularity selective",
       [](Config& c, const std::string&) {
         c.recompute.recompute_granularity = "selective";
         return std::string("note: --recompute-activations is the old spelling of --recompute-granularity selective");
       }},
      {"no-position-embedding", false, "Deprecated: no learned positions (Megatron accepts it with --position-embedding-type rope only)",
       [](Config& c, const std::string&) {
         c.model.no_position_embedding = true;  // (checked against the position embedding type once all flags are read)
         return std::string("note: --no-position-embedding is deprecated (as in Megatron): the positions come from --position-embedding-type");
       }},
      {"use-dist-ckpt", false, "Deprecated in Megatron, no effect (see --ckpt-format)",
       [](Config&, const std::string&) { return std::string("note: --use-dist-ckpt is deprecated (as in Megatron) and has no effect"); }},
      {"use-rotary-position-embeddings", false, "Old spelling of --position-embedding-type rope",
       [](Config& c, const std::string&) {
         c.model.position_embedding_type = "rope";
         return std::string("note: --use-rotary-position-embeddings is the old spelling of --position-embedding-type rope");
       }},
      {"distributed-timeout-minutes", true, "Megatron's collective timeout in minutes: megatrain's --distributed-timeout-seconds x 60",
       [](Config& c, const std::string& v) {
         const int64_t minutes = parse_alias_int("distributed-timeout-minutes", v);
         if (minutes < 1 || minutes > 1000000) throw ConfigError("--distributed-timeout-minutes must be in [1, 1000000], got " + v);
         c.parallel.distributed_timeout_seconds = 60 * minutes;
         return "note: --distributed-timeout-minutes " + v + " is --distributed-timeout-seconds " +
                std::to_string(c.parallel.distributed_timeout_seconds) + " (a run ends this long after another rank failed)";
       }},
      // Megatron's switches for its PyTorch implementation's kernels and memory: megatrain's results do not depend on
      // them (its own kernels; the same math either way), so each is accepted with a note.
      MT_INERT("cross-entropy-loss-fusion", false, "the CUDA engine's cross-entropy is always one fused pass (the same loss)"),
      MT_INERT("cross-entropy-fusion-impl", true, "megatrain has one cross-entropy implementation per engine"),
      MT_INERT("no-gradient-accumulation-fusion", false,
               "the weight gradients always accumulate in fp32 (Megatron without the fusion rounds each microbatch's to 16 bits first)"),
      MT_INERT("no-masked-softmax-fusion", false, "attention is fused (cuDNN) on the CUDA engine and exact on the CPU engine"),
      MT_INERT("no-bias-swiglu-fusion", false, "kernel fusion does not change megatrain's results"),
      MT_INERT("no-bias-dropout-fusion", false, "kernel fusion does not change megatrain's results"),
      MT_INERT("no-rope-fusion", false, "kernel fusion does not change megatrain's results"),
      MT_INERT("no-persist-layer-norm", false, "megatrain has its own norm kernels"),
      MT_INERT("attention-softmax-in-fp32", false, "the softmax is always computed in fp32"),
      MT_INERT("accumulate-allreduce-grads-in-fp32", false, "gradients always accumulate in fp32 (--grad-reduce-in-bf16 reduces in bf16)"),
      MT_INERT("manual-gc", false, "megatrain has no Python garbage collector"),
      MT_INERT("manual-gc-interval", true, "megatrain has no Python garbage collector"),
      MT_INERT("no-manual-gc-eval", false, "megatrain has no Python garbage collector"),
      MT_INERT("empty-unused-memory-level", true, "the CUDA engine keeps its memory pool (its peak is planned: megatrain plan)"),
      MT_INERT("no-mmap-bin-files", false, "how the .bin files are read does not change the data"),
      {"no-create-attention-mask-in-dataloader", false, "No attention-mask tensors (megatrain builds none); not with --reset-attention-mask",
       [](Config& c, const std::string&) {
         c.data.no_create_attention_mask = true;
         return std::string("note: --no-create-attention-mask-in-dataloader has no effect: megatrain never builds attention-mask tensors");
       }},
      MT_INERT("tp-comm-overlap", false, "megatrain overlaps the tensor-parallel communication its own way (docs/cuda-engine.md)"),
      MT_INERT("defer-embedding-wgrad-compute", false, "the schedule of the embedding's weight gradient does not change the results"),
      MT_INERT("ckpt-fully-parallel-save", false, "every rank writes its own shard"),
      // Settings in Megatron's functional tests and recipes without effect on megatrain's training.
      MT_INERT("no-ckpt-fully-parallel-save", false, "every rank writes its own shard"),
      MT_INERT("dist-ckpt-strictness", true,
               "megatrain's loads check every tensor: one missing, left over or of another shape is an error (with its name)"),
      MT_INERT("dist-ckpt-optim-fully-reshardable", false, "megatrain's checkpoints reshard to any layout, optimizer state included"),
      MT_INERT("no-use-tokenizer-model-from-checkpoint-args", false,
               "megatrain takes the tokenizer from the command (--tokenizer-type, --tokenizer-model), never from a checkpoint"),
      MT_INERT("logging-level", true, "megatrain's log lines are fixed (--log-interval sets how often)"),
      MT_INERT("timing-log-option", true, "megatrain logs the iteration's time as Megatron's default (minmax over ranks is not kept)"),
      MT_INERT("cuda-graph-impl", true, "megatrain does not capture CUDA graphs (the same results)"),
      MT_INERT("te-rng-tracker", false, "megatrain's random numbers are counter-based, without an RNG tracker (the same behaviour)"),
      MT_INERT("enable-experimental", false, "megatrain has no experimental switches"),
      MT_INERT("async-strategy", true, "--async-save writes from megatrain's own background thread (the same checkpoints)"),
      MT_INERT("check-weight-hash-across-dp-replicas-interval", true,
               "megatrain's data-parallel replicas apply the same reduced gradients (no hash check is made)"),
      MT_INERT("use-flashinfer-fused-rope", false, "a RoPE kernel choice (the same results)"),
      MT_INERT("enable-cuda-graph", false, "megatrain does not capture CUDA graphs (the same results)"),
      MT_INERT("rerun-mode", true,
               "megatrain does not re-run iterations to validate their results (a NaN or Inf loss or gradient norm is counted and "
               "skipped, --exit-on-nan-count ends the run)"),
      MT_INERT("straggler-minmax-count", true, "megatrain does not rank stragglers"),
      MT_INERT("ddp-average-in-collective", false, "the data-parallel mean is the same whether the collective or a scale takes it"),
      MT_INERT("overlap-param-gather-with-optimizer-step", false, "a scheduling choice of the parameter all-gathers (the same results)"),
      MT_INERT("wgrad-deferral-limit", true, "a scheduling choice of the weight gradients (the same results)"),
      MT_INERT("overlap-p2p-communication-warmup-flush", false, "a scheduling choice of the pipeline's sends (the same results)"),
      MT_REFUSED("attention-output-gate", false, "a gated attention output is not implemented"),
      MT_REFUSED("experimental-attention-variant", true, "other attention variants (linear, gated delta net) are not implemented"),
      MT_REFUSED("linear-attention-freq", true, "linear attention layers are not implemented"),
      MT_REFUSED("mtp-use-repeated-layer", false, "multi-token prediction's modules sharing one layer are not implemented (each has its own)"),
      MT_REFUSED("mtp-detach-heads", false, "multi-token prediction with detached embedding and output layer is not implemented"),
      MT_REFUSED("mtp-hsm", false, "multi-token prediction's hidden state mixing is not implemented"),
      MT_DEFAULT_ONLY("data-parallel-sharding-strategy", "no_shard", "Megatron FSDP is not implemented: use --use-distributed-optimizer"),
      MT_REFUSED("use-megatron-fsdp", false, "Megatron FSDP is not implemented: use --use-distributed-optimizer"),
      MT_REFUSED("fine-grained-activation-offloading", false, "activation offloading is not implemented: use --recompute-granularity full"),
      MT_INERT("ckpt-fully-parallel-load", false, "every rank reads its own shard"),
      MT_INERT("ckpt-assume-constant-structure", false, "megatrain's checkpoint layout is computed, not cached"),
      // Settings of features megatrain refuses elsewhere (their --optimizer, --position-embedding-type): no effect alone.
      MT_INERT("lion-beta1", true, "it belongs to --optimizer lion (megatrain has adam and sgd)"),
      MT_INERT("lion-beta2", true, "it belongs to --optimizer lion (megatrain has adam and sgd)"),
      MT_INERT("muon-coefficient-type", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-extra-scale-factor", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-fp32-matmul-prec", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-momentum", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-nesterov", false, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-no-split-qkv", false, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-num-ns-steps", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-scalar-optimizer", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-scale-mode", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-tp-mode", true, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("muon-use-syrk", false, "it belongs to --optimizer muon (megatrain has adam and sgd)"),
      MT_INERT("relative-attention-num-buckets", true, "it belongs to --position-embedding-type relative (T5's; not implemented)"),
      MT_INERT("relative-attention-max-distance", true, "it belongs to --position-embedding-type relative (T5's; not implemented)"),
      MT_INERT("export-force-local-attention", false, "Megatron reads it only where it builds a ModelOpt model (post-training export); "
               "pretraining's attention is the same either way"),
      MT_INERT("enable-gpt-oss", false, "Megatron applies GPT-OSS's YaRN values only where it builds a ModelOpt model (post-training); "
               "pretraining keeps the position embedding given: for YaRN give --position-embedding-type yarn and its flags"),
      MT_INERT("ddp-num-buckets", true, "how the gradients are bucketed for their reduction does not change the results (--ddp-bucket-size sets megatrain's)"),
      MT_INERT("ddp-pad-buckets-for-high-nccl-busbw", false, "the buckets' padding does not change the results"),
      MT_INERT("keep-fp8-transpose-cache", false, "where FP8 transposes are kept does not change the results"),
      MT_INERT("no-pin-cpu-grads", false, "pinned host memory does not change the results of the offloaded optimizer"),
      MT_INERT("no-pin-cpu-params", false, "pinned host memory does not change the results of the offloaded optimizer"),
      MT_INERT("use-torch-optimizer-for-cpu-offload", false, "the offloaded optimizer is megatrain's own AdamW, the same update"),
      MT_INERT_LIST("cuda-graph-modules", "megatrain does not capture CUDA graphs (the same results)"),
      MT_INERT_LIST("cuda-graph-scope", "megatrain does not capture CUDA graphs (the same results)"),
      MT_INERT("cuda-graph-warmup-steps", true, "megatrain does not capture CUDA graphs (the same results)"),
      MT_REFUSED_LIST("offload-modules", "activation offloading (--fine-grained-activation-offloading) is not implemented: use "
                                         "--recompute-granularity full"),
      MT_INERT("verify-integrity", false,
               "megatrain always writes a checksum of every checkpoint piece and of metadata.json, and checks them at every load"),
      MT_INERT("disable-gloo-process-groups", false, "megatrain makes no Gloo process groups (MPI or TCP on CPUs, NCCL on GPUs)"),
      MT_INERT("tp-comm-overlap-cfg", true, "it configures Transformer Engine's --tp-comm-overlap, which megatrain does its own way"),
      MT_INERT("use-transformer-engine-op-fuser", false, "a Transformer Engine kernel choice for the experts (the same results)"),
      MT_INERT("async-ckpt-use-cpu-shm", false, "--async-save writes from megatrain's own background thread (the same checkpoints)"),
      MT_REFUSED("override-ckpt-iteration", true, "overriding a checkpoint's iteration is not implemented: pick a checkpoint with --ckpt-step"),
      MT_REFUSED("check-for-large-grads", false, "a check for large gradients is not implemented (megatrain counts and skips NaN / inf steps): drop it"),
      MT_INERT("tiktoken-pattern", true, "it belongs to --tokenizer-type TikTokenizer"),
      MT_INERT("tiktoken-num-special-tokens", true, "it belongs to --tokenizer-type TikTokenizer"),
      {"disable-pad-vocab-size", false, "Megatron's other spelling of --no-pad-vocab-size",
       [](Config& c, const std::string&) {
         c.model.no_pad_vocab_size = true;
         return std::string("note: --disable-pad-vocab-size is --no-pad-vocab-size");
       }},
      // Megatron's tokenizer settings that shape how text becomes ids: training reads ids that `megatrain preprocess`
      // (or Megatron's preprocess_data.py) already made.
      MT_INERT("tokenizer-hf-no-use-fast", false, "training reads token ids made beforehand (megatrain preprocess tokenizes)"),
      MT_INERT("tokenizer-hf-no-include-special-tokens", false, "training reads token ids made beforehand (megatrain preprocess takes it)"),
      MT_INERT("tokenizer-hf-include-special-tokens", false, "training reads token ids made beforehand (megatrain preprocess tokenizes)"),
      MT_INERT("tokenizer-sentencepiece-legacy", false, "training reads token ids made beforehand (megatrain preprocess tokenizes)"),
      MT_INERT("no-tokenizer-sentencepiece-ignore-extra-whitespaces", false, "training reads token ids made beforehand (megatrain preprocess tokenizes)"),
      MT_INERT("disable-tokenizer-sentencepiece-ignore-extra-whitespaces", false,
               "training reads token ids made beforehand (megatrain preprocess tokenizes)"),
      MT_INERT("trust-remote-code", false, "megatrain reads a local tokenizer.json and runs no code from it"),
      MT_INERT("chat-template", true, "a chat template formats conversations for fine-tuning; pretraining reads token ids"),
      MT_REFUSED("tokenizer-metadata", true, "megatrain picks the tokenizer by --tokenizer-type and its files: drop it"),
      MT_REFUSED("tokenizer-special-tokens", true, "a tokenizer's own special-token list (TikTokenizer's) is not implemented: drop it"),
      MT_INERT("profile-step-start", true, "it belongs to --profile"),
      MT_INERT("profile-step-end", true, "it belongs to --profile"),
      MT_INERT("profile-ranks", true, "it belongs to --profile"),
      MT_INERT("no-async-tensor-model-parallel-allreduce", false, "the overlap of the tensor-parallel reduction does not change the results"),
      MT_INERT("overlap-p2p-communication", false, "the pipeline's transfers overlap megatrain's way; the results are the same"),
      MT_INERT("no-overlap-p2p-communication", false, "the pipeline's transfers overlap megatrain's way; the results are the same"),
      MT_INERT("align-grad-reduce", false, "the gradient reductions' launch order does not change the results"),
      MT_INERT("align-param-gather", false, "the parameter all-gathers' launch order does not change the results"),
      MT_INERT("no-gradient-reduce-div-fusion", false, "the gradient average is the same either way"),
      MT_INERT("bias-swiglu-fusion", false, "kernel fusion does not change megatrain's results"),
      MT_INERT("disable-bf16-reduced-precision-matmul", false, "megatrain's 16-bit GEMMs accumulate in fp32"),
      MT_INERT("use-cpu-initialization", false, "megatrain initialises every parameter on the host, the same values on any layout"),
      MT_INERT("use-persistent-ckpt-worker", false, "--async-save writes from a thread of its own"),
      MT_INERT("auto-detect-ckpt-format", false, "megatrain reads its own checkpoint format"),
      MT_INERT("num-dataset-builder-threads", true, "the dataset indices are built the same way"),
      MT_INERT("mmap-bin-files", false, "how the .bin files are read does not change the data"),
      MT_INERT("create-attention-mask-in-dataloader", false, "megatrain never builds attention-mask tensors"),
      {"check-for-nan-in-loss-and-grad", false, "Megatron's NaN check (its default): the first non-finite loss or gradient ends the run",
       [](Config& c, const std::string&) {
         c.training.exit_on_nan_count = 1;
         return std::string("note: --check-for-nan-in-loss-and-grad is --exit-on-nan-count 1 (megatrain's default skips up to 5 such steps)");
       }},
      {"no-check-for-nan-in-loss-and-grad", false, "Without Megatron's NaN check (megatrain still skips non-finite steps)",
       [](Config&, const std::string&) {
         return std::string("note: --no-check-for-nan-in-loss-and-grad: megatrain still skips a non-finite step (no update) and "
                            "--exit-on-nan-count still ends the run");
       }},
      MT_REFUSED("log-straggler", false, "megatrain has no straggler detector (the log line's time is the slowest rank's): drop it"),
      MT_REFUSED("log-progress", false, "megatrain writes no progress.txt; its progress is in metrics.jsonl under --log-dir: drop it"),
      MT_REFUSED("enable-one-logger", false, "megatrain has no telemetry: drop it"),
      MT_INERT("no-one-logger", false, "megatrain has no telemetry"),
      MT_REFUSED("one-logger-project", true, "megatrain has no telemetry: drop it"),
      MT_REFUSED("one-logger-run-name", true, "megatrain has no telemetry: drop it"),
      // Megatron features megatrain does not have: a clear error rather than "unknown flag".
      MT_REFUSED("use-torch-fsdp2", false, "megatrain shards the optimizer state with --use-distributed-optimizer; drop --use-torch-fsdp2"),
      MT_REFUSED("use-custom-fsdp", false, "megatrain shards the optimizer state with --use-distributed-optimizer; drop --use-custom-fsdp"),
      MT_REFUSED("wandb-exp-name", true, "Weights & Biases is not supported: metrics go to metrics.jsonl under --log-dir (and --tensorboard-dir)"),
      MT_REFUSED("wandb-save-dir", true, "Weights & Biases is not supported: metrics go to metrics.jsonl under --log-dir (and --tensorboard-dir)"),
      MT_REFUSED("wandb-entity", true, "Weights & Biases is not supported: metrics go to metrics.jsonl under --log-dir (and --tensorboard-dir)"),
      MT_REFUSED("init-method-xavier-uniform", false, "only the normal initialisation of --init-method-std is implemented: drop it"),
      MT_REFUSED("use-legacy-models", false, "megatrain has one model implementation (Megatron-Core's): drop it"),
      MT_REFUSED("hybrid-override-pattern", true, "hybrid (Mamba) models are not implemented"),
      MT_REFUSED("heterogeneous-layers-config-path", true, "heterogeneous layers are not implemented"),
      MT_REFUSED("retro-add-retriever", false, "RETRO is not implemented"),
      MT_REFUSED("qk-l2-norm", false, "L2 query-key normalisation is not implemented (--qk-layernorm is)"),
      MT_REFUSED("softmax-scale", true, "a custom attention softmax scale is not implemented (1 / sqrt(head dim) is used)"),
      MT_REFUSED("non-persistent-save-interval", true, "non-persistent (local) checkpoints are not implemented: use --save-interval"),
      MT_REFUSED("ckpt-convert-format", true, "megatrain writes HuggingFace models with `megatrain checkpoint export` (docs/huggingface.md)"),
      MT_REFUSED("pretrained-checkpoint", true, "load the weights with --load and --finetune"),
      MT_REFUSED("embedding-path", true, "pre-trained embeddings from a file are not implemented"),
      MT_REFUSED("data-args-path", true, "give the data with --data-path (or --train-data-path / --valid-data-path)"),
      MT_REFUSED("per-split-data-args-path", true, "give the data with --train-data-path / --valid-data-path / --test-data-path"),
      MT_REFUSED("object-storage-cache-path", true, "object-storage datasets are not supported: give local files"),
      MT_REFUSED("s3-cache-path", true, "object-storage datasets are not supported: give local files"),
      // Megatron's MoE flags outside megatrain's MoE (docs/moe.md).
      MT_INERT("moe-use-legacy-grouped-gemm", false, "megatrain has one grouped-GEMM path per engine (the same results)"),
      MT_INERT("moe-router-fusion", false, "kernel fusion does not change megatrain's results"),
      MT_INERT("overlap-moe-expert-parallel-comm", false,
               "megatrain does not overlap the EP all-to-alls with another microbatch's compute (the results are the same)"),
      MT_REFUSED("moe-extended-tp", false, "deprecated in Megatron: split the experts with --expert-tensor-parallel-size"),
      MT_REFUSED("moe-router-padding-for-fp8", false,
                 "padding the routing map for FP8 (extra zero-weight choices per expert) is not implemented: drop it (the CUDA engine "
                 "pads each expert's rows with zero rows to a multiple of 16, as Megatron's grouped MLP does without this flag; the "
                 "CPU engine needs no padding)"),
      MT_REFUSED("moe-router-topk-limited-devices", true,
                 "device-limited routing under this name left Megatron: use --moe-router-num-groups (the EP size) with "
                 "--moe-router-group-topk (the devices per token), which score each group by its best experts' sum"),
      // Megatron's newer MoE settings (its TransformerConfig fields as flags). Storage and kernel choices without effect on
      // the results, and the flex dispatcher's kernel knobs (megatrain runs flex as its own all-to-all), are accepted
      // with a note; what would change the model or its routing is refused by name.
      MT_INERT("moe-use-grouped-tensor", false, "megatrain has one grouped-GEMM path per engine (the same results)"),
      MT_INERT("moe-single-grouped-weight", false, "megatrain keeps each expert's weights as tensors of their own (the same model)"),
      MT_INERT("moe-single-grouped-bias", false, "megatrain keeps each expert's biases as tensors of their own (the same model)"),
      MT_INERT("moe-paged-stash", false, "the engines keep the experts' activations their own way (the same results)"),
      MT_INERT("moe-paged-stash-page-size", true, "the engines keep the experts' activations their own way (the same results)"),
      MT_INERT("moe-paged-stash-buffer-size-factor-cuda", true, "the engines keep the experts' activations their own way (the same results)"),
      MT_INERT("moe-paged-stash-buffer-size-factor-cpu", true, "the engines keep the experts' activations their own way (the same results)"),
      MT_INERT("moe-mlp-glu-interleave-size", true, "the layout of the GLU halves in memory does not change the model"),
      MT_INERT("moe-shared-expert-glu-interleave-size", true, "the layout of the GLU halves in memory does not change the model"),
      MT_INERT("moe-pad-experts-for-cuda-graph-inference", false, "an inference setting (megatrain trains)"),
      MT_INERT("moe-flex-dispatcher-num-sms", true, "a setting of the flex dispatcher's kernels (megatrain runs it as its own all-to-all)"),
      MT_INERT("moe-hybridep-num-sms", true, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-hybridep-num-sms-preprocessing", true, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-hybridep-num-blocks-permute", true, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-hybridep-num-blocks-unpermute", true, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-hybridep-pad-uneven-dispatch-inputs", false, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-permute-fusion-into-hybridep", false, "a setting of the flex dispatcher's HybridEP kernels (megatrain runs flex as its own all-to-all)"),
      MT_INERT("moe-ncclep-zero-copy", false, "a setting of the flex dispatcher's NCCL EP kernels (megatrain runs flex as its own all-to-all)"),
      // (these change what the flex dispatcher computes: HybridEP drops tokens past a rank's budget, NCCL EP quantises the wire)
      MT_REFUSED("moe-expert-rank-capacity-factor", true,
                 "the flex dispatcher's per-rank token budget (HybridEP drops past it) is not implemented: drop it (dropless), or use "
                 "--moe-expert-capacity-factor"),
      MT_DEFAULT_ONLY("moe-dispatch-fwd-dtype", "bf16", "NCCL EP's MXFP8 wire is not implemented: the dispatch travels in the training precision"),
      MT_DEFAULT_ONLY("moe-combine-bwd-dtype", "bf16", "NCCL EP's MXFP8 wire is not implemented: the combine's gradient travels in the training precision"),
      MT_REFUSED("moe-latent-size", true, "latent projections around the experts are not implemented: drop it"),
      MT_REFUSED("moe-router-force-biased", true,
                 "random router biases (a benchmarking aid) are not implemented: use --moe-router-force-load-balancing, or drop it"),
      MT_REFUSED("moe-router-padding-for-quantization", false,
                 "padding the routing map for FP8 / FP4 is not implemented: drop it (the CUDA engine pads each expert's rows with zero "
                 "rows to a multiple of 16, as Megatron's grouped MLP does without this flag)"),
      MT_REFUSED("moe-token-dropping", false, "unsupported in Megatron too: drop tokens with --moe-expert-capacity-factor"),
      MT_REFUSED("moe-enable-routing-replay", false, "routing replay is not implemented: drop it"),
      MT_INERT("moe-deepep-num-sms", true, "a setting of DeepEP's kernels (megatrain runs the flex dispatcher as its own all-to-all)"),
      MT_INERT("delay-wgrad-compute", false,
               "megatrain does not delay the weight gradients for the EP overlap (the same results; --pipeline-schedule zb-h1 defers them in "
               "the pipeline)"),
  };
}
#undef MT_INERT
#undef MT_REFUSED
#undef MT_DEFAULT_ONLY

}  // namespace

const std::vector<AliasSpec>& alias_table() {
  static const std::vector<AliasSpec> table = build_aliases();
  return table;
}

}  // namespace mt
