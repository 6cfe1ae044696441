// capabilities.cpp: the honest list of what each engine does not do yet.
#include "train/capabilities.h"

#include <algorithm>

#include "config/attention_window.h"
#include "config/layer_pattern.h"
#include "config/resolve.h"
#include "tensor/device_info.h"

namespace mt {

std::vector<std::string> unsupported_features(const Config& c, int64_t world, bool cuda_engine) {
  std::vector<std::string> out;
  auto no = [&](bool used, const std::string& what) {
    if (used) out.push_back(what);
  };
  const auto& p = c.parallel;
  (void)world;
  const bool cp = p.context_parallel_size > 1;
  no(cp && (p.cp_comm_type == "allgather" || p.cp_comm_type == "a2a+p2p"),
     "--cp-comm-type " + p.cp_comm_type + " is not implemented: use p2p (ring attention) or a2a (all-to-all over heads)");

  const auto& m = c.moe;
  no(m.num_experts && m.moe_apply_probs_on_input && m.moe_pad_expert_input_to_capacity,
     "--moe-apply-probs-on-input with --moe-pad-expert-input-to-capacity is not implemented (the padding rows would need weights of "
     "their own): drop one of them");

  const auto& pr = c.precision;
  no(pr.fp8_param_gather,
     "--fp8-param-gather (FP8 weights in the distributed optimizer's all-gather) is not implemented: drop it (the weights are gathered in "
     "bf16)");
  if (pr.fp8_format) {
    no(pr.fp8_recipe == "mxfp8", "--fp8-recipe mxfp8 needs Blackwell GPUs (MXFP8 tensor cores): use --fp8-recipe tensorwise");
  }
  // FP8 in MoE layers: the CPU engine emulates each expert's GEMMs with its own scales (Transformer Engine's grouped
  // linear, as Megatron's TEGroupedMLP uses it), amaxes reduced over TP (= expert-TP) and CP as the dense layers'.
  if (pr.fp8_format && c.moe.num_experts) {
    const int64_t etp = p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size);
    // (The CUDA engine's own gap, FP8 MoE with EP, is cuda_engine_gaps': --device auto then trains on the CPU engine.)
    // Delayed scaling: each expert's sites with scales and amax histories of their own (model/fp8_scaling.h), on both
    // engines; not under EP, where Megatron's amax reduction over DP would fold other ranks' experts into each slot.
    no(pr.fp8_recipe == "delayed" && p.expert_model_parallel_size > 1,
       "--fp8-recipe delayed in MoE layers with expert parallelism is not implemented (the amax histories are kept per local expert, and "
       "the reduction over data parallelism would mix other ranks' experts): use --fp8-recipe tensorwise or blockwise, or drop "
       "--expert-model-parallel-size");
    no(etp != p.tensor_model_parallel_size,
       "FP8 in MoE layers with --expert-tensor-parallel-size other than --tensor-model-parallel-size is not implemented (the experts' amaxes "
       "are reduced over TP): leave --expert-tensor-parallel-size at TP, or drop --fp8-format");
    no(cp && p.expert_model_parallel_size > 1,
       "FP8 in MoE layers with both context and expert parallelism is not implemented (the experts' amaxes are reduced over CP): drop one of "
       "them, or --fp8-format");
  }
  // Multi-token prediction (model/cpu/mtp_unit.cpp, docs/mtp.md): on the CPU engine, its modules on the last pipeline stage
  // with a copy of the word embeddings; no context parallelism, no FP8.
  if (c.model.mtp_num_layers) {
    no(p.pipeline_model_parallel_size > 1 && c.model.position_embedding_type == "learned_absolute",
       "--mtp-num-layers with learned absolute positions and pipeline parallelism is not implemented (the modules on the last stage would "
       "need a copy of the position embeddings): use RoPE, or drop one of them");
    // (Megatron's module layers take the window and no-RoPE pattern of decoder layer k, their own layer number; megatrain's
    // take the last layer's: the same wherever the pattern is uniform)
    no(c.model.window_attn_skip_freq.has_value() || c.model.no_rope_freq.has_value(),
       "--mtp-num-layers with --window-attn-skip-freq or --no-rope-freq (patterns over the layers) is not implemented: drop one of them");
    no(pr.fp8_format.has_value(), "--mtp-num-layers with FP8 is not implemented: drop --fp8-format");
  }
  no(c.data.no_create_attention_mask && c.data.reset_attention_mask,
     "--no-create-attention-mask-in-dataloader with --reset-attention-mask: in Megatron the first leaves the documents unmasked, "
     "megatrain masks them: drop one of the two");
  if (c.recompute.recompute_granularity.value_or("") == "selective") {
    // core_attn: flash attention stores no probabilities to recompute; mlp, moe and moe_act: the CUDA engine's
    // (cuda_engine_gaps). (shared_experts beside moe: part of the MoE block that moe recomputes whole, as in Megatron)
    // (mla_up_proj: multi-latent attention's up projections, which validation allows with --multi-latent-attention only)
    const bool moe = c.recompute.recomputes("moe");
    for (const auto& module : c.recompute.recompute_modules) {
      const bool covered = moe && module == "shared_experts";
      no(module != "core_attn" && module != "mlp" && module != "moe" && module != "moe_act" && module != "mla_up_proj" && !covered,
         "--recompute-modules " + module + " is not implemented (selective recompute covers core_attn, mlp, moe, moe_act and mla_up_proj): use moe "
         "(an MoE layer's whole MLP block, its activations included), moe_act (the experts' activation function) or mlp (a dense layer's), or "
         "--recompute-granularity full, or drop " + module);
    }
  }
  no(!cuda_engine && c.recompute.recompute_granularity.has_value(),
     "activation recompute (--recompute-granularity) is implemented on the CUDA engine only: drop it on the CPU engine (it keeps all activations)");
  no(c.data.dataloader_type == "cyclic" || c.data.dataloader_type == "external",
     "--dataloader-type " + c.data.dataloader_type + " is not implemented: megatrain reads samples in order (single)");
  const std::string tok = c.data.tokenizer_type.value_or("");
  no((!c.data.data_path.empty() || !c.data.train_data_path.empty()) && tok.empty(),
     "--data-path needs --tokenizer-type (GPT2BPETokenizer with --vocab-file/--merge-file, HuggingFaceTokenizer or Llama2Tokenizer / "
     "GPTSentencePieceTokenizer / SentencePieceTokenizer with --tokenizer-model, "
     "or NullTokenizer with --vocab-size)");
  no(c.checkpoint.ckpt_format != "torch_dist",
     "--ckpt-format " + c.checkpoint.ckpt_format + " is not supported: megatrain writes its own sharded, reshardable format "
     "(leave --ckpt-format at its default)");
  no(!cuda_engine && c.logging.log_memory_to_tensorboard,
     "--log-memory-to-tensorboard logs GPU memory, which the CPU engine has none of: train with --device cuda, or drop it");
  no(c.logging.wandb_project.has_value(), "--wandb-project is not supported: metrics go to metrics.jsonl under --log-dir");
  no(c.logging.profile, "--profile is not implemented yet");
  no(c.logging.timing_log_level > 0, "--timing-log-level > 0 is not implemented yet");
  no(p.distributed_backend == "gloo", "--distributed-backend gloo is not supported: megatrain uses MPI on CPUs and NCCL on GPUs");
  return out;
}

std::vector<std::string> inert_flag_notes(const Config& c, bool cuda_engine) {
  std::vector<std::string> out;
  const Config d;
  if (c.model.transformer_impl != d.model.transformer_impl) out.push_back("note: --transformer-impl has no effect: megatrain has one layer implementation");
  if (c.moe.num_experts && c.moe.moe_token_dispatcher_type == "flex") {
    out.push_back("note: --moe-token-dispatcher-type flex runs as megatrain's all-to-all dispatch (the same results; Megatron's DeepEP / "
                  "HybridEP / NCCL EP kernels are not used)");
  }
  if (c.data.num_workers != d.data.num_workers) out.push_back("note: --num-workers has no effect: samples are read on demand by the training thread");
  if (c.model.no_bias_gelu_fusion && (gated_mlp(c.model) || c.model.squared_relu)) {
    out.push_back("note: --no-bias-gelu-fusion: kernel fusion does not change megatrain's SwiGLU, quick GeGLU or squared ReLU");
  }
  if (c.logging.tensorboard_queue_size != d.logging.tensorboard_queue_size) {
    out.push_back("note: --tensorboard-queue-size has no effect: TensorBoard scalars are written and flushed at each log line");
  }
  if (c.moe.moe_per_layer_logging && !c.logging.tensorboard_dir) {
    out.push_back("note: --moe-per-layer-logging writes each layer's MoE losses to TensorBoard only (as Megatron's): add --tensorboard-dir "
                  "to keep them");
  }
  if (c.model.openai_gelu) {
    out.push_back("note: --openai-gelu: megatrain's GELU is always the tanh form (Megatron's bias-GELU fusion and --openai-gelu); nothing changes");
  }
  if (c.precision.fp8_format && c.precision.fp8_recipe != "delayed") {
    const PrecisionConfig& p = c.precision;
    const std::string recipe = p.fp8_recipe;
    if (p.fp8_amax_history_len != d.precision.fp8_amax_history_len || p.fp8_amax_compute_algo != d.precision.fp8_amax_compute_algo ||
        p.fp8_margin != d.precision.fp8_margin) {
      out.push_back("note: --fp8-amax-history-len, --fp8-amax-compute-algo and --fp8-margin belong to --fp8-recipe delayed: " + recipe +
                    " scales " + (recipe == "blockwise" ? "each block" : "each tensor") + " by its own amax");
    }
    if (p.tp_only_amax_red) out.push_back("note: --tp-only-amax-red belongs to --fp8-recipe delayed: " + recipe + " reduces no amax history");
    if (p.no_fp8_wgrad) {
      out.push_back("note: --no-fp8-wgrad has no effect with --fp8-recipe " + recipe + " (as in Megatron, which overrides the weight-gradient "
                    "precision for the delayed recipe only): the weight-gradient GEMMs stay in FP8");
    }
  }
  if (c.model.apply_query_key_layer_scaling) {
    out.push_back("note: --apply-query-key-layer-scaling changes nothing here: the attention scores and softmax are computed in fp32");
  }
  if (c.training.overlap_cpu_optimizer_d2h_h2d) {
    out.push_back("note: --overlap-cpu-optimizer-d2h-h2d has no effect: megatrain's offloaded optimizer always overlaps its copies with the update");
  }
  if (c.training.optimizer_offload_fraction != 1.0 && !(cuda_engine && c.training.optimizer_cpu_offload)) {
    out.push_back("note: --optimizer-offload-fraction has no effect without --optimizer-cpu-offload on the CUDA engine");
  }
  if (cuda_engine && c.training.optimizer_cpu_offload && !c.training.use_distributed_optimizer &&
      c.derived.data_parallel_size * c.parallel.context_parallel_size > 1) {
    out.push_back("note: --optimizer-cpu-offload without --use-distributed-optimizer: every data-parallel rank keeps and updates its own "
                  "copy of the offloaded state in host memory (the distributed optimizer shards it)");
  }
  if (cuda_engine) {
    if (c.model.attention_backend != d.model.attention_backend) {
      out.push_back("note: --attention-backend " + c.model.attention_backend + " has no effect: the CUDA engine always uses cuDNN's fused (flash) attention");
    }
    if (c.recompute.recompute_granularity && *c.recompute.recompute_granularity == "selective" && !c.recompute.recomputes("mlp") &&
        !c.recompute.recomputes("moe") && !(c.recompute.recomputes("moe_act") && c.moe.num_experts.value_or(0) > 0) &&
        !(c.recompute.recomputes("mla_up_proj") && c.model.multi_latent_attention)) {
      out.push_back("note: --recompute-granularity selective with core_attn keeps nothing less on the CUDA engine: flash attention never stores "
                    "the attention probabilities (--recompute-modules mlp / moe recompute the MLP blocks, moe_act the experts' activations)");
    }
    if (c.moe.num_experts && c.parallel.expert_model_parallel_size > 1 && c.moe.moe_token_dispatcher_type == "allgather") {
      out.push_back("note: --moe-token-dispatcher-type allgather: the CUDA engine dispatches by all-to-all with per-rank counts (the same results)");
    }
    return out;
  }
  if (c.model.attention_backend != d.model.attention_backend) {
    out.push_back("note: --attention-backend " + c.model.attention_backend + " has no effect on the CPU reference engine (exact attention)");
  }
  if (c.moe.num_experts) {
    if (c.moe.moe_grouped_gemm) out.push_back("note: --moe-grouped-gemm: the CPU reference engine runs one GEMM per local expert (the same results)");
    if (c.moe.moe_permute_fusion) out.push_back("note: --moe-permute-fusion: the CPU reference engine permutes tokens with plain copies (the same results)");
    if (c.moe.moe_shared_expert_overlap) {
      out.push_back("note: --moe-shared-expert-overlap: the CPU reference engine runs the shared expert after the dispatch (the same results)");
    }
  }
  if (c.training.optimizer_cpu_offload) out.push_back("note: --optimizer-cpu-offload: the CPU engine keeps the optimizer on the CPU already");
  if (c.precision.fp16) {
    out.push_back("note: --fp16 on the CPU engine rounds the weights to fp16; activations and gradients stay fp32, so the loss scale rarely meets an overflow");
  }
  if (c.precision.bf16) out.push_back("note: --bf16 on the CPU engine rounds the weights to bf16 after each step; activations stay fp32");
  return out;
}

std::vector<std::string> cuda_engine_gaps(const Config& c, int64_t world_size) {
#ifndef MEGATRAIN_HAVE_CUDA
  (void)c;
  (void)world_size;
  return {"this build has no CUDA backend"};
#else
  std::vector<std::string> out;
  auto no = [&](bool cond, const std::string& msg) {
    if (cond) out.push_back(msg);
  };
#ifndef MEGATRAIN_HAVE_NCCL
  no(world_size > 1, "this build has no NCCL: the CUDA engine runs one rank only (or use --device cpu for multi-rank runs)");
#endif
  no(!c.precision.bf16 && !c.precision.fp16,
     "the CUDA engine computes in bf16 or fp16: add --bf16 (or --fp16 with loss scaling); fp32 training runs with --device cpu");
  // (--no-rope-freq: gpt_cuda_units.cpp's attention units leave the rotation's table out in the layers without RoPE; its GPU
  // group, =no-rope, passed on an H200 in the thirty-seventh session.)
  // Selective recompute of the MLP blocks (--recompute-modules mlp / moe, --moe-layer-recompute; gpt_cuda_step.cpp's
  // backward re-runs a layer's MLP from its saved norm output, the layers' MLP activations in one shared record): its GPU
  // group (=selective-recompute) passed on an H200 in the thirty-seventh session. Not with FP8 (the recomputed casts would
  // record their amaxes and x^T again) nor with deferred weight gradients (ZB-H1: a later recompute overwrites what the
  // deferred GEMMs read).
  const bool mlp_recompute = c.recompute.recomputes("mlp") || c.recompute.recomputes("moe");
  // (GELU's exact erf form, Megatron's F.gelu: --no-bias-gelu-fusion, or GELU without biases, where Megatron drops its bias-GELU
  // fusion: the CUDA engine runs it apart from the GEMMs, kernels/cuda/activation_bf16.cu; and --log-num-zeros-in-grad,
  // cuda_engine_step.cpp's cuda::add_zero_count over the norm's chunks, summed over the ranks as the norm's partials are: both
  // written in the thirty-eighth session without a GPU; their GPU groups, =gelu-erf and =num-zeros, passed on an H100 in the
  // thirty-ninth.)
  // --recompute-modules moe_act (gpt_cuda_moe.cpp: the layers' routed experts' activations in one shared buffer, computed
  // again from fc1's output before each layer's expert backward; FP8 layers read none): its GPU group (=moe-act-recompute)
  // and its EP cases passed on an H100 in the thirty-eighth session.
  no(mlp_recompute && c.precision.fp8_format.has_value(),
     "--recompute-modules mlp / moe with FP8 is not implemented on the CUDA engine: use --recompute-granularity full, or drop them");
  no(mlp_recompute && c.parallel.pipeline_model_parallel_size > 1 && c.parallel.pipeline_schedule == "zb-h1",
     "--recompute-modules mlp / moe with --pipeline-schedule zb-h1 is not implemented on the CUDA engine (its deferred weight gradients read "
     "the recomputed activations): use another schedule, or drop them");
  // --add-qkv-bias alone (Qwen's QKV biases without the others) under TP: the bias's own gradient kernel and, with fewer
  // query groups than TP, the K/V replicas' bias sums; written, refused by name until it has run on several GPUs
  // (tests/gpu/run_parallel_parity.sh). On one GPU it runs.
  no(c.model.add_qkv_bias && c.model.disable_bias_linear && c.parallel.tensor_model_parallel_size > 1 &&
         !cuda_unverified_allowed("qkv-bias-tensor-parallel"),
     "--add-qkv-bias with tensor parallelism has not run on several GPUs yet on the CUDA engine: use --device cpu (the CPU engine runs it), "
     "or --tensor-model-parallel-size 1");
  no(c.model.qk_layernorm && c.derived.num_query_groups < c.parallel.tensor_model_parallel_size,
     "--qk-layernorm with fewer query groups than --tensor-model-parallel-size (K/V replicated over TP) is not implemented on the CUDA "
     "engine yet: raise --num-query-groups, lower TP, or --device cpu");
  if (c.model.hidden_size && c.model.num_attention_heads && *c.model.num_attention_heads > 0) {
    const int64_t d = c.model.kv_channels.value_or(*c.model.hidden_size / *c.model.num_attention_heads);
    no(d % 8 != 0 || d > 256, "cuDNN's fused attention needs a head dimension that is a multiple of 8 and at most 256 (this model: " +
                                  std::to_string(d) + "): change --hidden-size / --num-attention-heads / --kv-channels, or --device cpu");
    no(*c.model.hidden_size > 8192, "the CUDA norm kernels support hidden sizes up to 8192 (this model: " + std::to_string(*c.model.hidden_size) +
                                        "): use --device cpu");
  }
  // Document masks: cuDNN's attention with an additive bias built from the document starts (kernels/cuda/document_bias.h).
  no(c.data.reset_attention_mask && c.data.seq_length.value_or(8) % 8 != 0,
     "--reset-attention-mask on the CUDA engine needs --seq-length to be a multiple of 8 (its mask is written 8 columns at a time): change it, or "
     "use --device cpu");
  no(c.training.num_distributed_optimizer_instances > 1,
     "--num-distributed-optimizer-instances > 1 is implemented on the CPU engine only so far: drop it (one instance), or use --device cpu");
  no(c.training.test_mode, "--test-mode (Megatron's real-time replica test) is implemented on the CPU engine only: drop it, or use --device cpu");
  // Sliding-window attention (cuDNN's window mask in sdpa_cudnn.cpp's graphs): written in the fortieth session, its GPU
  // group (=window) run on an H200 in the forty-first; not under context parallelism yet.
  no(!attention_windows(c).empty() && c.parallel.context_parallel_size > 1,
     "--window-size with context parallelism is not implemented on the CUDA engine (its ring and all-to-all attention have no window; the "
     "CPU engine's do): drop one of them, or use --device cpu");
  no(c.model.softmax_type != "vanilla" && c.parallel.context_parallel_size > 1,
     "--softmax-type " + c.model.softmax_type + " with context parallelism is not implemented on the CUDA engine (its ring and all-to-all "
     "attention take no sink; the CPU engine's does): use --softmax-type vanilla, drop context parallelism, or use --device cpu");
  no(c.model.mtp_num_layers.has_value(),
     "--mtp-num-layers (multi-token prediction) is implemented on the CPU engine only so far: use --device cpu (--device auto picks it)");
  // Multi-latent attention (model/cuda/gpt_cuda_mla.cpp, forty-third session; its GPU group =mla and test_cuda_bf16_ops'
  // MLA heads ran on an H100 that session; under TP, test_cuda_context_parallel's MLA cases (TP ranks as threads on one
  // GPU) in the forty-fourth): without context parallelism; the CPU engine runs every layout.
  if (c.model.multi_latent_attention) {
    const std::string cpu = ": use --device cpu (the CPU engine runs it; --device auto picks it)";
    // (one device positions array: the learned embeddings' under --reset-position-ids, which RoPE must not take)
    no(c.model.position_embedding_type == "learned_absolute" && c.data.reset_position_ids,
       "--multi-latent-attention with learned positions and --reset-position-ids is not implemented on the CUDA engine (MLA's RoPE "
       "rotates by the sequence's positions, the learned embeddings take the reset ones: one positions array there)" + cpu);
    // With learned positions beside (Megatron's default position embedding) or none: the RoPE table built for MLA's own
    // rotation (gpt_cuda.cpp), written in the forty-fourth session without a GPU: refused by name until `MT_GPU_TEST_ONLY=mla
    // test_cuda_engine`'s learned-positions training has run.
    no(c.model.position_embedding_type != "rope" && !cuda_unverified_allowed("mla-learned-positions"),
       "--multi-latent-attention with --position-embedding-type " + c.model.position_embedding_type + " has not run on a GPU yet on the "
       "CUDA engine" + cpu + ", or --position-embedding-type rope");
    no(c.parallel.context_parallel_size > 1,
       "--multi-latent-attention with --context-parallel-size > 1 is not implemented on the CUDA engine (its ring and all-to-all attention take "
       "one head width)" + cpu + ", or CP 1");
    // (--recompute-modules mla_up_proj: gpt_cuda_mla.cpp's mla_up_forward again before the attention backward; its GPU cases
    // in =mla ran on an H100 in the forty-third session)
  }
  // GPT-OSS's attention sinks, YaRN and gated activation: written in the forty-first session, their GPU group (=gpt-oss)
  // and test_cuda_bf16_ops' gated units run on an H200 and an H100 in the forty-second.
  // Evaluation in microbatches other than training's: the model's buffers and cuDNN's plans are sized for the training one.
  no(c.training.eval_micro_batch_size && *c.training.eval_micro_batch_size != c.training.micro_batch_size.value_or(0),
     "--eval-micro-batch-size other than --micro-batch-size is not implemented on the CUDA engine (its buffers are sized for the training "
     "microbatch): drop it (--eval-global-batch-size alone sets the evaluation's batch), or use --device cpu");
  // --deterministic-mode: cuDNN's attention backward without its atomic dQ accumulator (kernels/cuda/sdpa_cudnn.h), NCCL's
  // ring algorithm (train_cmd.cpp). Its GPU group (=deterministic) passed on an H100 in the thirty-ninth session; refused on
  // several GPUs until it has run there (NCCL's reductions in a fixed order).
  no(c.training.deterministic_mode && world_size > 1 && !cuda_unverified_allowed("deterministic-mode-multi-gpu"),
     "--deterministic-mode on the CUDA engine has not run on several GPUs yet: use --device cpu, which is always bitwise repeatable, or drop it");
  if (const int64_t cp = c.parallel.context_parallel_size; cp > 1) {
    // Ring attention and the all-to-all's (model/cuda/gpt_cuda_context.cpp): verified on one GPU with the ranks as threads,
    // and refused until they have run on 2+ GPUs against the CPU engine.
    const std::string cpu = ": use --device cpu (the CPU engine runs it)";
    no(!cuda_unverified_allowed("context-parallel"),
       "--context-parallel-size > 1 on the CUDA engine has not run on several GPUs yet" + cpu);
    no(c.parallel.cp_comm_type != "p2p" && c.parallel.cp_comm_type != "a2a",
       "--cp-comm-type " + c.parallel.cp_comm_type + " is not implemented on the CUDA engine (p2p and a2a are)" + cpu + ", or --cp-comm-type p2p");
    no(c.model.attention_dropout > 0,
       "attention dropout with context parallelism is not implemented on the CUDA engine: set --attention-dropout 0, or use --device cpu");
    no(c.precision.fp8_format.has_value(), "FP8 with context parallelism is not implemented on the CUDA engine" + cpu);
    no(c.parallel.cp_comm_type == "p2p" && c.data.seq_length.value_or(0) % (8 * cp) != 0,
       "context parallelism on the CUDA engine needs --seq-length to be a multiple of 8 x --context-parallel-size (chunks of a multiple of 4 "
       "tokens for cuDNN): change it" + cpu);
  }
  if (c.precision.fp8_format) {
    // FP8 GEMMs (cuBLASLt, Hopper): both operands K-contiguous, every dimension a multiple of 16.
    no(c.precision.fp16, "FP8 on the CUDA engine runs beside bf16 (the working weights and activations): use --bf16 with --fp8-format");
    const auto gpus = visible_gpus();
    if (!gpus.empty() && gpus.front().major * 10 + gpus.front().minor < 89) {
      no(true, "FP8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, Blackwell); this GPU (" + gpus.front().name + ") is " +
                   std::to_string(gpus.front().major) + "." + std::to_string(gpus.front().minor) + ": drop --fp8-format");
    }
    if (c.precision.fp8_recipe == "blockwise" && !gpus.empty() && gpus.front().major * 10 + gpus.front().minor != 90) {
      no(true, "--fp8-recipe blockwise needs Hopper (compute capability 9.0: cuBLASLt's 128-element block scaling); this GPU (" +
                   gpus.front().name + ") is not: use --fp8-recipe delayed or tensorwise");
    }
    // FP8 under TP (gpt_cuda_fp8.cpp): tensorwise reduces each TP shard's amax over TP before its cast, delayed scaling
    // its amax accumulators at each update; the split TP layers and the side stream's weight gradients are off in FP8
    // layers. Written, refused by name until tests/gpu (test_cuda_context_parallel's FP8 cases, TP ranks as threads on one
    // GPU; run_parallel_parity.sh on two) have run it.
    const int64_t tp = c.parallel.tensor_model_parallel_size;
    no(tp > 1 && !cuda_unverified_allowed("fp8-tensor-parallel"),
       "FP8 with tensor parallelism has not run on GPUs yet on the CUDA engine (its amax reductions over TP): use --device cpu, or TP 1 "
       "on the CUDA engine");
    no(tp > 1 && c.precision.fp8_recipe == "blockwise",
       "--fp8-recipe blockwise with tensor parallelism is not implemented on the CUDA engine: use --fp8-recipe delayed or tensorwise, "
       "or --device cpu");
    no(tp > 1 && c.derived.num_query_groups < tp,
       "FP8 with fewer query groups than --tensor-model-parallel-size (K/V replicated over TP) is not implemented on the CUDA engine: "
       "use --device cpu, or raise --num-query-groups");
    no(tp > 1 && c.moe.num_experts.has_value(),
       "FP8 in MoE layers with tensor parallelism is not implemented on the CUDA engine: use --device cpu, or TP 1");
    // (With pipeline parallelism too: no test runs FP8 under TP and PP together on the CUDA engine yet, and ZB-H1's weight
    // gradients apart would cast TP-sharded output gradients again, each needing its amax over TP under tensorwise scaling.)
    no(tp > 1 && c.parallel.pipeline_model_parallel_size > 1,
       "FP8 with tensor and pipeline parallelism together is not implemented on the CUDA engine: use one of the two, or --device cpu");
    // Delayed scaling's amax reduction over DP (fp8_update: the accumulators over the amax group): written, refused by
    // name until run_parallel_parity.sh has run it on two GPUs.
    no(c.precision.fp8_recipe == "delayed" && c.derived.data_parallel_size > 1 && !c.precision.tp_only_amax_red &&
           !cuda_unverified_allowed("fp8-amax-data-parallel"),
       "FP8 delayed scaling with data parallelism has not run on GPUs yet (its amax reduction over DP): use --fp8-recipe tensorwise, "
       "--tp-only-amax-red (no reduction over DP), or --device cpu");
    const int64_t h = *c.model.hidden_size, heads = *c.model.num_attention_heads, d = c.model.kv_channels.value_or(h / heads);
    const int64_t F = c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(h, c.model.swiglu));
    const int64_t groups = c.derived.num_query_groups, T = c.training.micro_batch_size.value_or(1) * c.data.seq_length.value_or(16);
    // (Under TP each rank's share of the heads, the QKV width and the FFN: its GEMMs' sizes.)
    const int64_t share = std::max<int64_t>(1, tp);
    no(h % 16 != 0 || (heads / share * d) % 16 != 0 || ((heads + 2 * groups) / share * d) % 16 != 0 || (F / share) % 16 != 0 || T % 16 != 0,
       "FP8 GEMMs need the hidden size, heads x head dimension, the QKV width, --ffn-hidden-size (each divided by "
       "--tensor-model-parallel-size) and --micro-batch-size x --seq-length to be multiples of 16: change them, or use --device cpu");
    if (const auto& m = c.moe; m.num_experts) {  // (the experts' GEMMs: their rows are padded to 16 per expert)
      const int64_t F_moe = m.moe_ffn_hidden_size.value_or(F), F_shared = m.moe_shared_expert_intermediate_size.value_or(0);
      no(F_moe % 16 != 0 || F_shared % 16 != 0,
         "FP8 MoE layers on the CUDA engine need --moe-ffn-hidden-size and --moe-shared-expert-intermediate-size to be multiples of 16: "
         "change them, or use --device cpu");
    }
  }
  if (const auto& m = c.moe; m.num_experts) {
    // The CUDA MoE layer: one GPU with every expert local (docs/moe.md); the rest of the MoE flags on the CPU engine.
    const std::string cpu = ": use --device cpu (the CPU engine runs it), or drop it";
    // Data parallelism (every expert on every rank, expert-DP = DP): written, refused until it has run on several GPUs.
    const auto& par = c.parallel;
    // Tensor parallelism (the experts' shards over expert-TP = TP): verified on one GPU with the TP ranks as threads,
    // refused until it has run on several GPUs.
    no(par.tensor_model_parallel_size > 1 && !cuda_unverified_allowed("moe-tensor-parallel"),
       "mixture of experts with tensor parallelism has not run on several GPUs yet on the CUDA engine: use --device cpu (the CPU engine "
       "runs every expert layout)");
    // Expert-TP other than TP (Megatron's MoE parallel folding; gpt_cuda_expert_tensor_parallel.cpp): each TP rank's experts
    // take the rows of its own slice of the tokens, gathered over the expert-TP group. Written without a GPU (thirty-second
    // session), refused by name until test_cuda_expert_parallel's folded cases have passed and it has run on several GPUs.
    const int64_t pipeline = std::max<int64_t>(1, par.pipeline_model_parallel_size);
    const int64_t dp = world_size / std::max<int64_t>(1, par.tensor_model_parallel_size * pipeline * par.context_parallel_size);
    if (const int64_t etp = c.derived.expert_tensor_parallel_size; etp != par.tensor_model_parallel_size) {
      const int64_t expert_dp = world_size / std::max<int64_t>(1, etp * par.expert_model_parallel_size * pipeline);
      no(!cuda_unverified_allowed("expert-tensor-parallel"),
         "--expert-tensor-parallel-size other than --tensor-model-parallel-size has not run on GPUs yet on the CUDA engine: use --device cpu "
         "(the CPU engine runs every expert layout), or drop --expert-tensor-parallel-size");
      no(c.precision.fp16, "--expert-tensor-parallel-size other than --tensor-model-parallel-size in fp16 is not implemented on the CUDA "
                           "engine: use --bf16, or --device cpu");
      no(m.moe_apply_probs_on_input, "--moe-apply-probs-on-input with --expert-tensor-parallel-size other than --tensor-model-parallel-size is "
                                     "not implemented on the CUDA engine" + cpu);
      no(par.context_parallel_size > 1, "--expert-tensor-parallel-size other than --tensor-model-parallel-size with context parallelism is not "
                                        "implemented on the CUDA engine: use one of the two, or --device cpu");
      no(dp > 1 && !c.training.use_distributed_optimizer,
         "--expert-tensor-parallel-size other than --tensor-model-parallel-size with data parallelism needs --use-distributed-optimizer on the "
         "CUDA engine (each parameter's norm and update by its owner): add it, or use --device cpu");
      no(dp > 1 && (c.training.overlap_grad_reduce || c.training.overlap_param_gather),
         "--overlap-grad-reduce / --overlap-param-gather with --expert-tensor-parallel-size other than --tensor-model-parallel-size is not "
         "implemented on the CUDA engine (the DP reductions would run beside the expert-TP gathers on another communicator): drop them, or use "
         "--device cpu");
      no(dp == 1 && expert_dp > 1,
         "--expert-tensor-parallel-size other than --tensor-model-parallel-size without data parallelism needs --expert-model-parallel-size x "
         "--expert-tensor-parallel-size = --tensor-model-parallel-size on the CUDA engine (each expert shard on one rank; expert-DP is " +
             std::to_string(expert_dp) + "): change one of them, or use --device cpu");
    }
    const bool context = par.context_parallel_size > 1;
    // The router's input noise (kernels/cuda/moe.cu's input_jitter_kernel and the input backward's noisy router term; run
    // on a GPU in the thirty-sixth session): its token places are the rows' natural order, not CP's chunks.
    no(m.moe_input_jitter_eps.value_or(0.0) > 0 && context, "--moe-input-jitter-eps with context parallelism is not implemented on the CUDA engine" + cpu);
    // Quantile balancing (kernels/cuda/moe_quantile.cu: the choice scores, each expert's quantile by an exact selection,
    // the qb_beta update after the step; its GPU group, =moe-quantile, passed in the thirty-seventh session): not with CP
    // (the quantiles over every CP rank's tokens).
    no(m.load_balancing_is("quantile_balancing") && context,
       "--moe-router-load-balancing-type quantile_balancing with context parallelism is not implemented on the CUDA engine" + cpu);
    // (Megatron's list form, several auxiliary losses at once: each type's statistics and gradient per score in
    // kernels/cuda/moe.cu's moe_balance_finish, summed; its GPU group, =moe-aux-list, passed in the thirty-seventh session.)
    // Sinkhorn routing (kernels/cuda/moe.cu's sinkhorn_kernel normalises the microbatch's logits) and
    // --moe-router-force-load-balancing's random logits: not with CP on this engine.
    no(m.load_balancing_is("sinkhorn") && context,
       "--moe-router-load-balancing-type sinkhorn with context parallelism is not implemented on the CUDA engine" + cpu);
    no(m.moe_router_force_load_balancing && context,
       "--moe-router-force-load-balancing with context parallelism is not implemented on the CUDA engine" + cpu);
    no(context && par.expert_model_parallel_size > 1,
       "expert parallelism with context parallelism is not implemented on the CUDA engine: use one of the two, or --device cpu");
    no(context && m.moe_expert_capacity_factor.has_value(),
       "--moe-expert-capacity-factor with context parallelism is not implemented on the CUDA engine (the drops decided over every CP rank's "
       "tokens): drop it, or use --device cpu");
    const bool pp = par.pipeline_model_parallel_size > 1;
    no(pp && m.aux_loss_coeff("global_aux_loss") > 0,
       "global_aux_loss with pipeline parallelism is not implemented on the CUDA engine (its running counts with several microbatches in "
       "flight): use aux_loss or seq_aux_loss, or --device cpu");
    no(pp && par.pipeline_schedule == "zb-h1",
       "--pipeline-schedule zb-h1 with MoE layers is not implemented on the CUDA engine (the experts' weight gradients run with the "
       "backward): use --pipeline-schedule 1f1b, or --device cpu");
    // Expert parallelism (the alltoall dispatch over NCCL, the experts' gradients over expert-DP): written, refused until
    // it has run on several GPUs; its layers are checked on one GPU by tests/gpu/test_cuda_expert_parallel.
    const bool ep = par.expert_model_parallel_size > 1;
    no(ep && !cuda_unverified_allowed("expert-parallel"),
       "--expert-model-parallel-size > 1 has not run on GPUs yet on the CUDA engine: use --device cpu (the CPU engine runs every expert layout)");
    no(ep && dp > 1 && par.expert_model_parallel_size != dp && (c.training.overlap_grad_reduce || c.training.overlap_param_gather),
       "--overlap-grad-reduce / --overlap-param-gather with expert parallelism smaller than data parallelism is not implemented on the CUDA "
       "engine (the DP reductions would run beside the EP all-to-alls on another communicator): drop them, set "
       "--expert-model-parallel-size to the data-parallel size, or use --device cpu");
    no(ep && dp > 1 && !c.training.use_distributed_optimizer,
       "expert parallelism on the CUDA engine needs --use-distributed-optimizer (each parameter's norm and update by its owner): add it, "
       "or use --device cpu");
    const bool data_parallel = dp > 1;
    no(data_parallel && !cuda_unverified_allowed("moe-data-parallel"),
       "mixture of experts with data parallelism has not run on several GPUs yet on the CUDA engine: use --device cpu for multi-rank MoE");
    no(data_parallel && m.aux_loss_coeff("global_aux_loss") > 0,
       "global_aux_loss with data parallelism is not implemented on the CUDA engine (its expert counts summed over DP): use aux_loss or "
       "seq_aux_loss, or --device cpu");
    // fp16: the MoE kernels in the run's 16-bit type, the router's aux and z gradients times the loss scale. With expert
    // parallelism not: fp16's gradient reductions average, which would scale the experts' gradients by 1 / expert-DP
    // instead of 1 / DP.
    no(c.precision.fp16 && ep, "expert parallelism in fp16 is not implemented on the CUDA engine: use --bf16, or --device cpu");
    no(*m.num_experts > 256, "the CUDA MoE router supports at most 256 experts" + cpu);
    // --moe-apply-probs-on-input (gpt_cuda_moe.cpp: the weighted gather, unit combine weights, the weights' gradient from the
    // experts' input gradients): GPU-verified on one rank (thirtieth session); not with EP.
    no(m.moe_apply_probs_on_input && ep, "--moe-apply-probs-on-input with expert parallelism is not implemented on the CUDA engine" + cpu);
    // FP8 in MoE layers (gpt_cuda_moe_fp8.cpp: each expert's GEMMs, its rows padded to 16), with any recipe on one rank's
    // experts; under EP (tensorwise and blockwise: delayed is refused with EP on both engines) the padded blocks travel,
    // so every expert's rows stay 16-aligned where they arrive. Written without a GPU (thirty-first session), refused by
    // name until test_cuda_expert_parallel's FP8 cases have passed, and then with EP until it has run on several GPUs.
    no(c.precision.fp8_format.has_value() && ep && !cuda_unverified_allowed("fp8-expert-parallel"),
       "FP8 in MoE layers with expert parallelism has not run on a GPU yet on the CUDA engine: use --device cpu, or drop --fp8-format");
    no(c.precision.fp8_format.has_value() && ep && !c.model.disable_bias_linear,
       "FP8 in MoE layers with expert parallelism and biases is not implemented on the CUDA engine (the padding rows inside an expert's "
       "arrived rows would take the fc1 bias's activation into fc2's scale): add --disable-bias-linear, or use --device cpu");
    // The experts' rows sit back to back in their fc1 and activation buffers (and with biases the fc1 biases before the
    // next parameter): 16-byte aligned for cuBLASLt where the expert width is a multiple of 8. (SwiGLU experts' GEMMs
    // take any width.)
    const int64_t F_dense = c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(c.model.hidden_size.value_or(0), c.model.swiglu));
    const int64_t F_moe = m.moe_ffn_hidden_size.value_or(F_dense) / std::max<int64_t>(1, c.derived.expert_tensor_parallel_size);
    no((!gated_mlp(c.model) || !c.model.disable_bias_linear) && F_moe % 8 != 0,
       "the CUDA engine's GELU and squared-ReLU experts, and experts with biases, need --moe-ffn-hidden-size / --expert-tensor-parallel-size "
       "to be a multiple of 8 (this model: " + std::to_string(F_moe) + "): change --moe-ffn-hidden-size, or use --device cpu");
  }
  const bool pp = c.parallel.pipeline_model_parallel_size > 1;
  // The CUDA stages (1F1B, interleaved and ZB-H1 over NCCL) are in, and tested on one GPU as two stages of one process;
  // until tests/gpu/run_parallel_parity.sh's PP layouts have checked them against the CPU engine on several GPUs,
  // pipeline parallelism stays refused here (MEGATRAIN_CUDA_UNVERIFIED=pipeline-parallel lifts it for those runs).
  no(pp && !cuda_unverified_allowed("pipeline-parallel"),
     "--pipeline-model-parallel-size > 1 has not run on GPUs yet on the CUDA engine: use --device cpu (every pipeline schedule runs on the "
         "CPU engine)");
  no(pp && c.parallel.pipeline_schedule == "zb-h1" && c.recompute.recompute_granularity == "full",
     "--pipeline-schedule zb-h1 on the CUDA engine runs the weight gradients apart only without full recompute (a recomputed layer's "
     "activations do not outlive its backward): drop the recompute, use --device cpu or --pipeline-schedule 1f1b");
  no(pp && !c.model.untie_embeddings_and_output_weights && c.training.overlap_grad_reduce && c.derived.data_parallel_size > 1,
     "--overlap-grad-reduce with tied embeddings across pipeline stages is not implemented on the CUDA engine: drop it, or add "
     "--untie-embeddings-and-output-weights");
  no(c.training.optimizer_cpu_offload && c.training.overlap_param_gather && c.training.use_distributed_optimizer &&
         c.derived.data_parallel_size * c.parallel.context_parallel_size > 1,
     "--optimizer-cpu-offload with --overlap-param-gather is not implemented on the CUDA engine (the offloaded weights come up after the "
     "step): drop --overlap-param-gather");
  no(c.training.optimizer != "adam", "--optimizer " + c.training.optimizer + " is not implemented on the CUDA engine: use adam");
  no(c.recompute.recompute_granularity && *c.recompute.recompute_granularity == "full" && !c.recompute.recompute_method,
     "--recompute-granularity full needs --recompute-method uniform or block");
  return out;
#endif
}

}  // namespace mt
