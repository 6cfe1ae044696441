// flags.cpp: the flag table (Megatron names, groups and defaults) and typed parsing of flag values; the aliases
// (Megatron flags accepted with a note, old spellings, those refused by name) are flag_aliases.cpp's.
#include "config/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "config/errors.h"

namespace mt {
namespace {

#define F(GROUP, NAME, FIELD, HELP, ...) \
  FlagSpec { NAME, GROUP, HELP, {__VA_ARGS__}, [](Config& c) -> FieldPtr { return &c.FIELD; } }

const char* kNet = "Network size";
const char* kReg = "Regularization";
const char* kInit = "Initialization";
const char* kTrain = "Training";
const char* kLr = "Learning rate";
const char* kDist = "Distributed";
const char* kPrec = "Mixed precision";
const char* kRecompute = "Activation recompute";
const char* kMoe = "Mixture of experts";
const char* kData = "Data and dataloader";
const char* kTok = "Tokenizer";
const char* kCkpt = "Checkpointing";
const char* kLog = "Logging and validation";

std::vector<FlagSpec> build_table() {
  return {
      // Network size
      F(kNet, "num-layers", model.num_layers, "Number of transformer layers (required)"),
      F(kNet, "hidden-size", model.hidden_size, "Transformer hidden size (required)"),
      F(kNet, "num-attention-heads", model.num_attention_heads, "Number of attention heads (required)"),
      F(kNet, "ffn-hidden-size", model.ffn_hidden_size, "MLP hidden size (default 4*h; int(4h*2/3/64)*64 with --swiglu)"),
      F(kNet, "kv-channels", model.kv_channels, "Attention head dimension (default hidden-size / num-attention-heads)"),
      F(kNet, "group-query-attention", model.group_query_attention, "Use grouped-query attention"),
      F(kNet, "num-query-groups", model.num_query_groups, "Number of key/value groups with --group-query-attention"),
      F(kNet, "swiglu", model.swiglu, "SwiGLU MLP instead of GELU"),
      F(kNet, "normalization", model.normalization, "Normalization layer", "LayerNorm", "RMSNorm"),
      F(kNet, "norm-epsilon", model.norm_epsilon, "Epsilon of the normalization layers"),
      F(kNet, "position-embedding-type", model.position_embedding_type, "Position embedding",
        "learned_absolute", "rope", "yarn", "none"),
      F(kNet, "rotary-base", model.rotary_base, "RoPE base"),
      F(kNet, "rotary-percent", model.rotary_percent, "Fraction of the head dimension RoPE rotates"),
      F(kNet, "use-rope-scaling", model.use_rope_scaling, "LLaMA 3.1's RoPE frequency scaling (low 1, high 4, original 8192 positions)"),
      F(kNet, "rope-scaling-factor", model.rope_scaling_factor, "The factor of --use-rope-scaling"),
      F(kNet, "rotary-seq-len-interpolation-factor", model.rotary_seq_len_interpolation_factor,
        "RoPE's linear position interpolation: every position divided by this factor (HuggingFace's linear rope type)"),
      F(kNet, "rotary-scaling-factor", model.rotary_scaling_factor, "YaRN: the factor of the context's extension (s; 1: none)"),
      F(kNet, "yarn-original-max-position-embeddings", model.yarn_original_max_position_embeddings,
        "YaRN: the context the model was trained on before the extension (default 4096)"),
      F(kNet, "yarn-beta-fast", model.yarn_beta_fast, "YaRN: frequencies that turn more than this many times over the original context are kept (default 32)"),
      F(kNet, "yarn-beta-slow", model.yarn_beta_slow, "YaRN: frequencies that turn fewer than this many times are divided by the factor (default 1)"),
      F(kNet, "mscale", model.mscale, "YaRN: the attention factor's coefficient (cos and sin scale by 0.1 mscale ln(s) + 1 over ...)"),
      F(kNet, "mscale-all-dim", model.mscale_all_dim, "YaRN: ... 0.1 mscale-all-dim ln(s) + 1"),
      F(kNet, "yarn-correction-range-round-to-int", model.yarn_correction_range_round_to_int,
        "YaRN: round the correction range's ends to whole dimensions (the default)"),
      F(kNet, "no-yarn-correction-range-round-to-int", model.no_yarn_correction_range_round_to_int,
        "YaRN: keep the correction range's ends fractional (GPT-OSS's)"),
      F(kNet, "window-size", model.window_size,
        "Sliding-window attention, Megatron's \"LEFT,RIGHT\": query i attends to keys i - LEFT .. i (RIGHT is 0 in a causal model; "
        "-1: unbounded)"),
      F(kNet, "softmax-type", model.softmax_type,
        "Attention's softmax: vanilla; off-by-one (a sink logit 0 joins every row's denominator); learnable (a trained sink logit per "
        "head, GPT-OSS's attention sinks)",
        "vanilla", "off-by-one", "learnable"),
      F(kNet, "multi-latent-attention", model.multi_latent_attention,
        "Multi-latent attention (DeepSeek-V2/V3's): queries and keys/values through low-rank latents, a shared RoPE key part"),
      F(kNet, "q-lora-rank", model.q_lora_rank, "MLA: the queries' latent rank (unset: one query projection)"),
      F(kNet, "kv-lora-rank", model.kv_lora_rank, "MLA: the keys' and values' latent rank"),
      F(kNet, "qk-head-dim", model.qk_head_dim, "MLA: the query and key heads' width without RoPE"),
      F(kNet, "qk-pos-emb-head-dim", model.qk_pos_emb_head_dim, "MLA: the query and key heads' width with RoPE (the key's shared by the heads)"),
      F(kNet, "v-head-dim", model.v_head_dim, "MLA: the value heads' width"),
      F(kNet, "rope-type", model.rope_type, "MLA's RoPE: rope, or yarn (the default: --rotary-scaling-factor, --mscale, --mscale-all-dim)"),
      F(kNet, "cache-mla-latents", model.cache_mla_latents, "MLA: cache the latents at inference (refused in training, as Megatron)"),
      F(kNet, "mla-down-proj-fusion", model.mla_down_proj_fusion,
        "MLA: Megatron's fused down projections (the same arithmetic: accepted, computed as the separate ones)"),
      F(kNet, "mtp-num-layers", model.mtp_num_layers,
        "Multi-token prediction (DeepSeek-V3's): that many extra modules after the decoder, each predicting one token further "
        "ahead (an embedding norm, a hidden-state norm, a projection of the two, a transformer layer of the last layer's kind, a "
        "norm; the output layer and embedding shared)"),
      F(kNet, "mtp-loss-scaling-factor", model.mtp_loss_scaling_factor,
        "Multi-token prediction: the modules' mean losses times this over --mtp-num-layers join the training loss"),
      F(kNet, "window-attn-skip-freq", model.window_attn_skip_freq,
        "The layers with full attention beside --window-size: N gives every N-th layer (numbers divisible by N) full attention, or a "
        "list of 1 (window) / 0 (full) per layer such as \"([1]*3+[0])*2\""),
      F(kNet, "no-rope-freq", model.no_rope_freq,
        "Layers without RoPE (Llama 4's): N skips it in every N-th layer (the last of each N), or a list of 0/1 per layer such as "
        "\"([0]*3+[1])*2\" (1: no RoPE)"),
      F(kNet, "max-position-embeddings", model.max_position_embeddings, "Maximum sequence length the model supports (>= --seq-length)"),
      F(kNet, "untie-embeddings-and-output-weights", model.untie_embeddings_and_output_weights, "Separate output layer weights"),
      F(kNet, "disable-bias-linear", model.disable_bias_linear, "No biases in the linear layers"),
      F(kNet, "add-qkv-bias", model.add_qkv_bias, "Biases in the QKV layers even with --disable-bias-linear (Qwen's)"),
      F(kNet, "make-vocab-size-divisible-by", model.make_vocab_size_divisible_by, "Pad the vocabulary to a multiple of this times TP"),
      F(kNet, "transformer-impl", model.transformer_impl, "Layer implementation (megatrain always uses its own kernels)",
        "transformer_engine", "local"),
      F(kNet, "attention-backend", model.attention_backend, "Attention implementation", "auto", "flash", "fused",
        "unfused", "local"),
      F(kNet, "apply-layernorm-1p", model.apply_layernorm_1p,
        "Zero-centred norm weights: every norm scales by 1 + weight (in fp32), the weights start at 0"),
      F(kNet, "apply-query-key-layer-scaling", model.apply_query_key_layer_scaling, "Scale Q*K^T by 1/layer-number (fp16)"),
      F(kNet, "qk-layernorm", model.qk_layernorm, "Normalize each query and key head before RoPE"),
      F(kNet, "openai-gelu", model.openai_gelu, "GELU in its tanh form (megatrain's GELU always is; docs/design-notes.md)"),
      F(kNet, "squared-relu", model.squared_relu, "Squared ReLU as the MLP's activation"),
      F(kNet, "quick-geglu", model.quick_geglu, "Quick GeGLU (GPT-OSS's): a gated MLP, gate x sigmoid(1.702 gate) times the linear half"),
      F(kNet, "glu-linear-offset", model.glu_linear_offset, "A gated MLP's offset added to its linear half: act(gate) (linear + offset)"),
      F(kNet, "activation-func-clamp-value", model.activation_func_clamp_value,
        "A gated MLP's clamp: the gate at most this, the linear half within +-this (quick GeGLU; SwiGLU in MoE layers)"),
      F(kNet, "no-bias-gelu-fusion", model.no_bias_gelu_fusion,
        "GELU in its exact erf form (Megatron's F.gelu) instead of its bias-GELU fusion's tanh form; Megatron also uses it without "
        "biases (--disable-bias-linear)"),
      F(kNet, "rotary-interleaved", model.rotary_interleaved, "RoPE on interleaved channel pairs instead of halves"),
      F(kNet, "vocab-size", model.vocab_size, "Vocabulary size (NullTokenizer / mock data)"),
      // Regularization
      F(kReg, "hidden-dropout", model.hidden_dropout, "Dropout after attention and MLP"),
      F(kReg, "attention-dropout", model.attention_dropout, "Dropout on attention probabilities"),
      F(kReg, "weight-decay", training.weight_decay, "Decoupled weight decay (not on biases and norms)"),
      F(kReg, "apply-wd-to-qk-layernorm", training.apply_wd_to_qk_layernorm,
        "Weight decay on the QK norms' weights and biases too (--qk-layernorm; Qwen3-Next's)"),
      F(kReg, "clip-grad", training.clip_grad, "Global gradient-norm clipping (0 disables)"),
      F(kReg, "adam-beta1", training.adam_beta1, "Adam beta1"),
      F(kReg, "adam-beta2", training.adam_beta2, "Adam beta2"),
      F(kReg, "adam-eps", training.adam_eps, "Adam epsilon"),
      F(kReg, "sgd-momentum", training.sgd_momentum, "SGD momentum"),
      // Initialization
      F(kInit, "seed", training.seed, "Random seed (parameters, dropout, data order)"),
      F(kInit, "init-method-std", model.init_method_std, "Std of the normal parameter initialisation"),
      // Training
      F(kTrain, "micro-batch-size", training.micro_batch_size, "Samples per microbatch per data-parallel rank (required)"),
      F(kTrain, "global-batch-size", training.global_batch_size, "Samples per iteration (default micro-batch-size * DP)"),
      F(kTrain, "eval-global-batch-size", training.eval_global_batch_size,
        "Samples per evaluation iteration (default --global-batch-size); a multiple of --eval-micro-batch-size x DP"),
      F(kTrain, "eval-micro-batch-size", training.eval_micro_batch_size, "Samples per evaluation microbatch per data-parallel rank (default --micro-batch-size)"),
      F(kTrain, "rampup-batch-size", training.rampup_batch_size, "Batch-size ramp-up: <start> <increment> <samples>"),
      F(kTrain, "step-batch-size-schedule", training.step_batch_size_schedule,
        "Step-wise global batch sizes, Megatron's \"THRESHOLD:BATCH ...\": from each threshold of consumed tokens on (K, M, B, T "
        "suffixes; the first 0) that batch size; not with --global-batch-size"),
      F(kTrain, "train-iters", training.train_iters, "Iterations to train for"),
      F(kTrain, "train-samples", training.train_samples, "Samples to train for (instead of --train-iters)"),
      F(kTrain, "optimizer", training.optimizer, "Optimizer", "adam", "sgd"),
      F(kTrain, "use-distributed-optimizer", training.use_distributed_optimizer, "Shard optimizer state over data parallel (ZeRO-1)"),
      F(kTrain, "optimizer-cpu-offload", training.optimizer_cpu_offload, "Keep optimizer state and the update on the CPU"),
      F(kTrain, "use-precision-aware-optimizer", training.use_precision_aware_optimizer,
        "Megatron's precision-aware optimizer: Adam's state in the storage types below (needs --use-distributed-optimizer)"),
      F(kTrain, "main-grads-dtype", training.main_grads_dtype, "With --use-precision-aware-optimizer: the gradients' type (bf16 not implemented)",
        "fp32", "bf16"),
      F(kTrain, "main-params-dtype", training.main_params_dtype,
        "With --use-precision-aware-optimizer: the master weights' type (fp16 not implemented)", "fp32", "fp16"),
      F(kTrain, "exp-avg-dtype", training.exp_avg_dtype,
        "With --use-precision-aware-optimizer: Adam's first moment stored in this type (computed in fp32; fp16 and fp8 not implemented)",
        "fp32", "fp16", "bf16", "fp8"),
      F(kTrain, "exp-avg-sq-dtype", training.exp_avg_sq_dtype,
        "With --use-precision-aware-optimizer: Adam's second moment stored in this type (computed in fp32; fp16 and fp8 not implemented)",
        "fp32", "fp16", "bf16", "fp8"),
      F(kTrain, "optimizer-offload-fraction", training.optimizer_offload_fraction,
        "With --optimizer-cpu-offload: the share of the optimizer state (master weights, Adam moments) on the CPU, the first parameters'"),
      F(kTrain, "overlap-cpu-optimizer-d2h-h2d", training.overlap_cpu_optimizer_d2h_h2d,
        "Overlap the offloaded optimizer's copies with its update (megatrain always does)"),
      F(kTrain, "deterministic-mode", training.deterministic_mode,
        "Bitwise-repeatable runs: the CPU engine always is; the CUDA engine (one Hopper GPU so far) runs cuDNN's deterministic attention backward and fixed GEMM algorithms, and NCCL_ALGO=Ring"),
      F(kTrain, "test-mode", training.test_mode,
        "Megatron's real-time test: with --qk-layernorm, the query / key norms compared across the data- and tensor-parallel replicas "
        "at every iteration; a difference ends the run naming the parameter"),
      F(kTrain, "calculate-per-token-loss", training.calculate_per_token_loss,
        "The gradient as the sum over the global batch's loss tokens, not the mean of the microbatches' means (the reported loss is that sum either way; not with MoE)"),
      F(kTrain, "exit-interval", training.exit_interval, "Exit (after a checkpoint when --save is set) at an iteration divisible by this"),
      F(kTrain, "exit-duration-in-mins", training.exit_duration_in_mins,
        "Exit (after a checkpoint when --save is set) at the first iteration after training has run this many minutes"),
      F(kTrain, "exit-on-nan-count", training.exit_on_nan_count, "Stop after this many non-finite steps in a row (megatrain)"),
      // Learning rate
      F(kLr, "lr", training.lr, "Peak learning rate"),
      F(kLr, "min-lr", training.min_lr, "Learning rate at the end of the decay"),
      F(kLr, "decoupled-lr", training.decoupled_lr,
        "Peak learning rate of the input embedding and output layer weights (the same schedule)"),
      F(kLr, "decoupled-min-lr", training.decoupled_min_lr, "Final learning rate of those weights (default --min-lr)"),
      F(kLr, "lr-decay-style", training.lr_decay_style, "Decay shape", "constant", "linear", "cosine",
        "inverse-square-root", "WSD"),
      F(kLr, "lr-decay-iters", training.lr_decay_iters, "Iterations to decay over (default --train-iters)"),
      F(kLr, "lr-decay-samples", training.lr_decay_samples, "Samples to decay over (with --train-samples)"),
      F(kLr, "lr-warmup-iters", training.lr_warmup_iters, "Linear warmup iterations"),
      F(kLr, "lr-warmup-fraction", training.lr_warmup_fraction, "Warmup as a fraction of the decay iterations"),
      F(kLr, "lr-warmup-samples", training.lr_warmup_samples, "Warmup samples (with --train-samples)"),
      F(kLr, "lr-warmup-init", training.lr_warmup_init, "Learning rate at the start of warmup"),
      F(kLr, "lr-wsd-decay-iters", training.lr_wsd_decay_iters, "Final-decay iterations of the WSD schedule"),
      F(kLr, "lr-wsd-decay-style", training.lr_wsd_decay_style, "Final-decay shape of the WSD schedule", "exponential",
        "linear", "cosine", "minus_sqrt"),
      // Distributed
      F(kDist, "tensor-model-parallel-size", parallel.tensor_model_parallel_size, "Tensor-parallel size (TP)"),
      F(kDist, "pipeline-model-parallel-size", parallel.pipeline_model_parallel_size, "Pipeline-parallel size (PP; CPU engine)"),
      F(kDist, "context-parallel-size", parallel.context_parallel_size, "Context-parallel size (CP)"),
      F(kDist, "expert-model-parallel-size", parallel.expert_model_parallel_size, "Expert-parallel size (EP)"),
      F(kDist, "expert-tensor-parallel-size", parallel.expert_tensor_parallel_size, "Tensor-parallel size inside experts (default TP)"),
      F(kDist, "sequence-parallel", parallel.sequence_parallel, "Shard norms and dropout along the sequence over TP"),
      F(kDist, "num-layers-per-virtual-pipeline-stage", parallel.num_layers_per_virtual_pipeline_stage, "Layers per virtual stage (interleaved 1F1B)"),
      F(kDist, "num-virtual-stages-per-pipeline-rank", parallel.num_virtual_stages_per_pipeline_rank, "Virtual stages per pipeline rank (interleaved 1F1B)"),
      F(kDist, "pipeline-model-parallel-layout", parallel.pipeline_model_parallel_layout,
        "The (virtual) pipeline stages' layers, Megatron's string: E embedding, t transformer layer, m MTP layer (in the loss's stage), L loss, | between stages, "
        "(...)*n and x*n repeats, e.g. \"Et*3|(tt|)*6L\"; stages / PP virtual stages per rank"),
      F(kDist, "microbatch-group-size-per-virtual-pipeline-stage", parallel.microbatch_group_size_per_vp_stage,
        "Interleaved 1F1B: microbatches that pass through a virtual stage together (default the pipeline size; between it and the microbatches)"),
      F(kDist, "decoder-first-pipeline-num-layers", parallel.decoder_first_pipeline_num_layers, "Layers on the first pipeline stage (uneven split)"),
      F(kDist, "decoder-last-pipeline-num-layers", parallel.decoder_last_pipeline_num_layers, "Layers on the last pipeline stage (uneven split)"),
      F(kDist, "account-for-embedding-in-pipeline-split", parallel.account_for_embedding_in_pipeline_split,
        "Count the input embedding as one layer when splitting the stages"),
      F(kDist, "account-for-loss-in-pipeline-split", parallel.account_for_loss_in_pipeline_split,
        "Count the output layer and loss as one layer when splitting the stages"),
      F(kDist, "pipeline-schedule", parallel.pipeline_schedule, "Pipeline schedule (megatrain): 1f1b (interleaved with virtual stages) or zb-h1",
        "1f1b", "zb-h1"),
      F(kDist, "cp-comm-type", parallel.cp_comm_type, "Context-parallel communication", "p2p", "a2a", "allgather",
        "a2a+p2p"),
      F(kDist, "use-tp-pp-dp-mapping", parallel.use_tp_pp_dp_mapping, "Rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp"),
      F(kDist, "distributed-backend", parallel.distributed_backend, "Collective backend for GPUs", "nccl", "gloo"),
      F(kDist, "distributed-timeout-seconds", parallel.distributed_timeout_seconds, "Exit this long after another rank failed (megatrain)"),
      F(kDist, "overlap-grad-reduce", training.overlap_grad_reduce, "Overlap the gradient reduction with backward"),
      F(kDist, "overlap-param-gather", training.overlap_param_gather, "Overlap the parameter all-gather with forward"),
      F(kDist, "ddp-bucket-size", training.ddp_bucket_size, "Elements per gradient-reduction bucket"),
      F(kDist, "num-distributed-optimizer-instances", training.num_distributed_optimizer_instances,
        "With --use-distributed-optimizer: the optimizer state sharded within each of this many slices of DP x CP, their shards' "
        "gradients all-reduced across the slices (Megatron's partial distributed optimizer)"),
      // Mixed precision
      F(kPrec, "bf16", precision.bf16, "bfloat16 weights with fp32 master weights (CPU engine: fp32 activations)"),
      F(kPrec, "fp16", precision.fp16, "float16 weights with loss scaling (CPU engine: fp32 activations)"),
      F(kPrec, "loss-scale", precision.loss_scale, "Static loss scale (dynamic when unset)"),
      F(kPrec, "initial-loss-scale", precision.initial_loss_scale, "Initial dynamic loss scale"),
      F(kPrec, "min-loss-scale", precision.min_loss_scale, "Minimum dynamic loss scale"),
      F(kPrec, "loss-scale-window", precision.loss_scale_window, "Steps without overflow before the scale grows"),
      F(kPrec, "hysteresis", precision.hysteresis, "Overflows tolerated before the scale shrinks"),
      F(kPrec, "fp8-format", precision.fp8_format, "FP8 format", "e4m3", "hybrid"),
      F(kPrec, "fp8-recipe", precision.fp8_recipe, "FP8 scaling recipe", "delayed", "tensorwise", "mxfp8", "blockwise"),
      F(kPrec, "fp8-amax-history-len", precision.fp8_amax_history_len, "FP8 amax history length"),
      F(kPrec, "fp8-amax-compute-algo", precision.fp8_amax_compute_algo, "FP8 amax algorithm", "max", "most_recent"),
      F(kPrec, "fp8-margin", precision.fp8_margin, "FP8 delayed scaling: scale down by 2^margin"),
      F(kPrec, "no-fp8-wgrad", precision.no_fp8_wgrad, "FP8: the weight-gradient GEMMs in bf16"),
      F(kPrec, "tp-only-amax-red", precision.tp_only_amax_red, "FP8 delayed scaling: reduce the amaxes over TP (and CP) only, not DP"),
      F(kPrec, "fp8-param-gather", precision.fp8_param_gather, "FP8 weights in the distributed optimizer's all-gather (not implemented)"),
      F(kPrec, "first-last-layers-bf16", precision.first_last_layers_bf16, "FP8: the first and last layers in bf16"),
      F(kPrec, "num-layers-at-start-in-bf16", precision.num_layers_at_start_in_bf16, "FP8: layers at the start in bf16 (--first-last-layers-bf16)"),
      F(kPrec, "num-layers-at-end-in-bf16", precision.num_layers_at_end_in_bf16, "FP8: layers at the end in bf16 (--first-last-layers-bf16)"),
      F(kPrec, "grad-reduce-in-bf16", precision.grad_reduce_in_bf16, "Reduce gradients in bf16"),
      F(kPrec, "ddp-reduce-scatter-with-fp32-accumulation", precision.ddp_reduce_scatter_with_fp32_accumulation,
        "Gradient reductions summed in fp32 (megatrain's fp32 gradients are; refused with --grad-reduce-in-bf16, which sums in bf16)"),
      F(kPrec, "fp32-residual-connection", precision.fp32_residual_connection,
        "Keep the residual stream in fp32 (default: the 16-bit type of --bf16/--fp16; the CPU engine always fp32)"),
      // Recompute
      F(kRecompute, "recompute-granularity", recompute.recompute_granularity, "Activation recompute", "full", "selective"),
      F(kRecompute, "recompute-method", recompute.recompute_method, "Which layers recompute (full)", "uniform", "block"),
      F(kRecompute, "recompute-num-layers", recompute.recompute_num_layers, "Layers per recompute unit / recomputed layers"),
      F(kRecompute, "recompute-modules", recompute.recompute_modules,
        "Modules recomputed with selective recompute: core_attn, and on the CUDA engine mlp (dense layers' MLP), moe (MoE layers' MLP) and "
        "moe_act (the experts' activation function)"),
      F(kRecompute, "moe-layer-recompute", recompute.moe_layer_recompute,
        "Deprecated (as in Megatron): --recompute-granularity selective with moe among --recompute-modules"),
      // MoE
      F(kMoe, "num-experts", moe.num_experts, "Experts per MoE layer"),
      F(kMoe, "moe-router-topk", moe.moe_router_topk, "Experts each token is routed to"),
      F(kMoe, "moe-ffn-hidden-size", moe.moe_ffn_hidden_size, "Expert MLP hidden size (default --ffn-hidden-size)"),
      F(kMoe, "moe-layer-freq", moe.moe_layer_freq,
        "MoE layer pattern: N (every N-th layer from the first) or a list such as \"[0]+[1]*3\" (one 0/1 per layer)"),
      F(kMoe, "moe-router-load-balancing-type", moe.moe_router_load_balancing_type,
        "Load balancing: one type, or several auxiliary losses at once (a --moe-aux-loss-coeff each)", "aux_loss",
        "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none"),
      F(kMoe, "moe-aux-loss-coeff", moe.moe_aux_loss_coeff,
        "Auxiliary load-balancing loss weight (one per --moe-router-load-balancing-type type)"),
      F(kMoe, "moe-z-loss-coeff", moe.moe_z_loss_coeff, "Router z-loss weight"),
      F(kMoe, "moe-token-dispatcher-type", moe.moe_token_dispatcher_type,
        "Token dispatcher (the same results; flex, Megatron's DeepEP / HybridEP kernels, runs as megatrain's all-to-all)", "allgather", "alltoall",
        "flex"),
      F(kMoe, "moe-flex-dispatcher-backend", moe.moe_flex_dispatcher_backend,
        "The flex dispatcher's kernels in Megatron (kept for its checks: megatrain runs flex as its all-to-all)", "deepep", "hybridep", "ncclep"),
      F(kMoe, "moe-enable-deepep", moe.moe_enable_deepep, "Deprecated in Megatron: --moe-flex-dispatcher-backend deepep (with flex)"),
      F(kMoe, "moe-grouped-gemm", moe.moe_grouped_gemm, "Grouped GEMM over local experts (same results)"),
      F(kMoe, "moe-permute-fusion", moe.moe_permute_fusion, "Fused token permutation (same results)"),
      F(kMoe, "moe-expert-capacity-factor", moe.moe_expert_capacity_factor, "Expert capacity factor (dropless when unset)"),
      F(kMoe, "moe-token-drop-policy", moe.moe_token_drop_policy, "Tokens kept at capacity: highest probability or earliest",
        "probs", "position"),
      F(kMoe, "moe-pad-expert-input-to-capacity", moe.moe_pad_expert_input_to_capacity, "Pad every expert's input to its capacity"),
      F(kMoe, "moe-router-pre-softmax", moe.moe_router_pre_softmax, "Softmax over all experts before top-k"),
      F(kMoe, "moe-router-score-function", moe.moe_router_score_function, "Router scores", "softmax", "sigmoid",
        "sqrtsoftplus"),
      F(kMoe, "moe-router-dtype", moe.moe_router_dtype, "Router GEMM and scores precision", "fp32", "fp64"),
      F(kMoe, "moe-router-topk-scaling-factor", moe.moe_router_topk_scaling_factor, "Multiplies the routing weights"),
      F(kMoe, "moe-router-num-groups", moe.moe_router_num_groups, "Expert groups for group-limited routing"),
      F(kMoe, "moe-router-group-topk", moe.moe_router_group_topk, "Groups each token may route to"),
      F(kMoe, "moe-router-enable-expert-bias", moe.moe_router_enable_expert_bias,
        "Aux-loss-free balancing: a per-expert bias on the scores for the choice, updated outside the gradient"),
      F(kMoe, "moe-router-bias-update-rate", moe.moe_router_bias_update_rate, "Expert bias update rate"),
      F(kMoe, "moe-router-quantile-balancing-ema", moe.moe_router_quantile_balancing_ema,
        "quantile_balancing: the share of the old per-expert bias kept at each update (0: replaced by the batch's quantile)"),
      F(kMoe, "moe-shared-expert-intermediate-size", moe.moe_shared_expert_intermediate_size, "Shared expert hidden size"),
      F(kMoe, "moe-input-jitter-eps", moe.moe_input_jitter_eps,
        "The router's input multiplied by noise uniform in [1 - eps, 1 + eps] per token and channel (the experts' input unchanged)"),
      F(kMoe, "moe-shared-expert-gate", moe.moe_shared_expert_gate,
        "The shared expert's output scaled by a sigmoid gate of the token (a [1, hidden] weight; Qwen2-MoE's)"),
      F(kMoe, "moe-shared-expert-overlap", moe.moe_shared_expert_overlap, "Overlap the shared expert with the dispatch (same results)"),
      F(kMoe, "moe-apply-probs-on-input", moe.moe_apply_probs_on_input,
        "Scale each expert's input by its routing weight instead of its output (Llama 4's MoE; needs --moe-router-topk 1)"),
      F(kMoe, "moe-router-force-load-balancing", moe.moe_router_force_load_balancing,
        "Benchmarking: random router logits (standard normal per token and expert), so the routing is balanced; their gradient "
        "passes straight through to the router (Megatron's)"),
      F(kMoe, "moe-use-upcycling", moe.moe_use_upcycling,
        "Start the MoE model from the dense model's checkpoint in --load (its MLPs copied into the experts), save it to --save "
        "(iteration 0) and train from there (Megatron's upcycling; once: later runs drop it)"),
      F(kMoe, "moe-upcycling-granularity", moe.moe_upcycling_granularity,
        "Upcycling: the dense MLP's width over an expert's (--moe-ffn-hidden-size); each expert takes one slice of it (1: a copy)"),
      F(kMoe, "moe-per-layer-logging", moe.moe_per_layer_logging,
        "Each layer's auxiliary losses to TensorBoard as moe/<name>_layer_<i> (with --tensorboard-dir)"),
      // Data
      F(kData, "data-path", data.data_path, "Dataset prefix, or weighted blend 'w1 prefix1 w2 prefix2 ...'"),
      F(kData, "split", data.split, "Train,valid,test split weights"),
      F(kData, "train-data-path", data.train_data_path, "Training dataset prefix(es)"),
      F(kData, "valid-data-path", data.valid_data_path, "Validation dataset prefix(es)"),
      F(kData, "test-data-path", data.test_data_path, "Test dataset prefix(es)"),
      F(kData, "mock-data", data.mock_data, "Megatron's learnable mock data"),
      F(kData, "text-data-path", data.text_data_path, "A plain text file trained on as bytes (megatrain)"),
      F(kData, "seq-length", data.seq_length, "Sequence length (required)"),
      F(kData, "data-cache-path", data.data_cache_path, "Where dataset indices are cached"),
      F(kData, "num-workers", data.num_workers, "Data loader threads"),
      F(kData, "dataloader-type", data.dataloader_type, "Data loader", "single", "cyclic", "external"),
      F(kData, "eod-mask-loss", data.eod_mask_loss, "No loss on end-of-document tokens"),
      F(kData, "reset-position-ids", data.reset_position_ids, "Restart positions after each end of document"),
      F(kData, "reset-attention-mask", data.reset_attention_mask, "No attention across documents"),
      // Tokenizer
      F(kTok, "tokenizer-type", data.tokenizer_type, "Tokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
        "SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer", "NullTokenizer", "ByteTokenizer"),
      F(kTok, "vocab-file", data.vocab_file, "GPT-2 vocab.json"),
      F(kTok, "merge-file", data.merge_file, "GPT-2 merges.txt"),
      F(kTok, "tokenizer-model", data.tokenizer_model, "HuggingFaceTokenizer: a local tokenizer.json, or its directory; SentencePiece: the .model file"),
      F(kTok, "null-tokenizer-eod-id", data.null_tokenizer_eod_id, "NullTokenizer's end-of-document id (default: --vocab-size, its extra id)"),
      F(kTok, "null-tokenizer-pad-id", data.null_tokenizer_pad_id,
        "NullTokenizer's padding id: labels equal to it take no loss and it reads as id 0, as Megatron's GPT dataset (-1: none)"),
      F(kTok, "allow-ambiguous-pad-tokens", data.allow_ambiguous_pad_tokens,
        "A padding id equal to the end-of-document id still takes those labels' loss away (Megatron's opt-in; otherwise no padding)"),
      F(kTok, "vocab-extra-ids", data.vocab_extra_ids, "T5's sentinel tokens: only 0 (megatrain trains decoder-only models)"),
      F(kTok, "padded-vocab-size", model.padded_vocab_size,
        "The embedding's rows, as given (a multiple of TP, at least the vocabulary); default: padded by --make-vocab-size-divisible-by x TP"),
      F(kTok, "no-pad-vocab-size", model.no_pad_vocab_size,
        "No vocabulary padding: the embedding's rows are the tokenizer's vocabulary (Megatron then needs --padded-vocab-size; megatrain "
        "takes the vocabulary)"),
      // Checkpointing
      F(kCkpt, "save", checkpoint.save, "Directory to save checkpoints to"),
      F(kCkpt, "load", checkpoint.load, "Directory to load a checkpoint from"),
      F(kCkpt, "save-interval", checkpoint.save_interval, "Iterations between checkpoints"),
      F(kCkpt, "ckpt-step", checkpoint.ckpt_step, "Iteration to load instead of the latest"),
      F(kCkpt, "no-save-optim", checkpoint.no_save_optim, "Do not save optimizer state"),
      F(kCkpt, "no-save-rng", checkpoint.no_save_rng, "Do not save RNG state"),
      F(kCkpt, "no-load-optim", checkpoint.no_load_optim, "Do not load optimizer state"),
      F(kCkpt, "no-load-rng", checkpoint.no_load_rng, "Do not load RNG state"),
      F(kCkpt, "finetune", checkpoint.finetune, "Load weights only and start at iteration 0"),
      F(kCkpt, "ckpt-format", checkpoint.ckpt_format, "Checkpoint format (megatrain writes its own sharded format)",
        "torch_dist", "torch", "zarr", "fsdp_dtensor"),
      F(kCkpt, "async-save", checkpoint.async_save, "Write checkpoints in the background"),
      F(kCkpt, "use-checkpoint-args", checkpoint.use_checkpoint_args, "Take model arguments from the checkpoint"),
      F(kCkpt, "override-opt-param-scheduler", checkpoint.override_opt_param_scheduler,
        "At a resume, train with this command's learning-rate schedule where the checkpoint's differs (else an error)"),
      F(kCkpt, "use-checkpoint-opt-param-scheduler", checkpoint.use_checkpoint_opt_param_scheduler,
        "At a resume, keep the checkpoint's learning-rate schedule where this command's differs (else an error)"),
      F(kCkpt, "ckpt-keep-last", checkpoint.ckpt_keep_last, "Keep only the newest N checkpoints, deleted after a newer one is committed (megatrain; 0 keeps all)"),
      F(kCkpt, "save-retain-interval", checkpoint.save_retain_interval,
        "Keep the checkpoints of iterations that are multiples of N and the newest: each save deletes the one before it otherwise "
        "(Megatron's; a multiple of --save-interval)"),
      // Logging / validation
      F(kLog, "log-interval", logging.log_interval, "Iterations between log lines"),
      F(kLog, "log-throughput", logging.log_throughput, "Log TFLOP/s per GPU (megatrain always does)"),
      F(kLog, "log-params-norm", logging.log_params_norm, "Log the parameter norm"),
      F(kLog, "log-num-zeros-in-grad", logging.log_num_zeros_in_grad,
        "Log the number of zero entries in the gradient (each parameter counted once; not on skipped iterations)"),
      F(kLog, "tensorboard-dir", logging.tensorboard_dir, "TensorBoard directory (rank 0 writes the scalars of each log line there)"),
      F(kLog, "tensorboard-log-interval", logging.tensorboard_log_interval, "TensorBoard points only at log lines of iterations divisible by this"),
      F(kLog, "tensorboard-queue-size", logging.tensorboard_queue_size, "TensorBoard queue size (no effect: written at each log line)"),
      F(kLog, "log-batch-size-to-tensorboard", logging.log_batch_size_to_tensorboard, "Write the batch size to TensorBoard"),
      F(kLog, "log-validation-ppl-to-tensorboard", logging.log_validation_ppl_to_tensorboard, "Write the validation perplexity to TensorBoard"),
      F(kLog, "log-world-size-to-tensorboard", logging.log_world_size_to_tensorboard, "Write the world size to TensorBoard"),
      F(kLog, "log-timers-to-tensorboard", logging.log_timers_to_tensorboard, "Write the iteration time (and with --log-throughput the throughput) to TensorBoard, Megatron's timers at --timing-log-level 0"),
      F(kLog, "log-memory-to-tensorboard", logging.log_memory_to_tensorboard, "Write GPU memory use to TensorBoard (CUDA engine)"),
      F(kLog, "no-log-learning-rate-to-tensorboard", logging.no_log_learning_rate_to_tensorboard, "Leave the learning rate out of TensorBoard"),
      F(kLog, "no-log-loss-scale-to-tensorboard", logging.no_log_loss_scale_to_tensorboard, "Leave the loss scale out of TensorBoard"),
      F(kLog, "wandb-project", logging.wandb_project, "Weights & Biases project"),
      F(kLog, "eval-interval", logging.eval_interval, "Iterations between validation runs"),
      F(kLog, "eval-iters", logging.eval_iters, "Iterations per validation run"),
      F(kLog, "timing-log-level", logging.timing_log_level, "Timer detail (0-2)"),
      F(kLog, "profile", logging.profile, "Profile (nsys ranges)"),
      F(kLog, "log-dir", logging.log_dir, "Directory of the JSON-lines metrics file (megatrain)"),
      F(kLog, "device", logging.device, "Where to run (megatrain)", "auto", "cpu", "cuda"),
  };
}
#undef F

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string where(const FlagSpec& spec, const std::string& source) {
  return "--" + spec.name + (source.empty() ? "" : " (" + source + ")");
}

int64_t parse_int(const FlagSpec& spec, const std::string& v, const std::string& source) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0) {
    // Accept integral floats such as "1e6" or "4096.0" that YAML writers produce.
    double d = std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0' && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      return static_cast<int64_t>(d);
    }
    throw ConfigError(where(spec, source) + ": expected an integer, got '" + v + "'");
  }
  return x;
}

double parse_float(const FlagSpec& spec, const std::string& v, const std::string& source) {
  char* end = nullptr;
  errno = 0;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(d)) {
    throw ConfigError(where(spec, source) + ": expected a number, got '" + v + "'");
  }
  return d;
}


std::string check_choice(const FlagSpec& spec, const std::string& v, const std::string& source) {
  if (spec.choices.empty()) return v;
  for (const auto& c : spec.choices) {
    if (c == v) return v;
  }
  std::string list;
  for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
  throw ConfigError(where(spec, source) + ": '" + v + "' is not one of " + list);
}

}  // namespace

bool parse_bool_text(std::string_view flag, const std::string& v, const std::string& source) {
  std::string t = v;
  std::transform(t.begin(), t.end(), t.begin(), ::tolower);
  if (t == "true" || t == "yes" || t == "on" || t == "1") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0") return false;
  throw ConfigError("--" + std::string(flag) + (source.empty() ? "" : " (" + source + ")") +
                    ": expected true or false, got '" + v + "'");
}

const std::vector<FlagSpec>& flag_table() {
  static const std::vector<FlagSpec> table = build_table();
  return table;
}

std::string normalize_flag_name(std::string_view name) {
  while (!name.empty() && name.front() == '-') name.remove_prefix(1);
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

const FlagSpec* find_flag(std::string_view name) {
  const std::string n = normalize_flag_name(name);
  for (const auto& f : flag_table()) {
    if (f.name == n) return &f;
  }
  return nullptr;
}

const AliasSpec* find_alias(std::string_view name) {
  const std::string n = normalize_flag_name(name);
  for (const auto& a : alias_table()) {
    if (a.name == n) return &a;
  }
  return nullptr;
}

std::string nearest_flag(std::string_view name) {
  const std::string n = normalize_flag_name(name);
  std::string best;
  size_t best_d = SIZE_MAX;
  auto consider = [&](const std::string& cand) {
    size_t d = edit_distance(n, cand);
    // A misspelt prefix ("--num-layer") should find the flag it starts.
    if (cand.rfind(n, 0) == 0 && n.size() >= 4) d = std::min(d, size_t{1});
    if (d < best_d) {
      best_d = d;
      best = cand;
    }
  };
  for (const auto& f : flag_table()) consider(f.name);
  for (const auto& a : alias_table()) consider(a.name);
  return best;
}

std::string flag_value_text(const Config& cfg_in, const FlagSpec& spec) {
  Config cfg = cfg_in;
  auto number = [](double d) {
    std::ostringstream o;
    o << d;
    return o.str();
  };
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(*p);
        } else if constexpr (std::is_same_v<T, double>) {
          return number(*p);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, OptInt>) {
          return *p ? std::to_string(**p) : "";
        } else if constexpr (std::is_same_v<T, OptFloat>) {
          return *p ? number(**p) : "";
        } else if constexpr (std::is_same_v<T, OptString>) {
          return p->value_or("");
        } else if constexpr (std::is_same_v<T, FloatList>) {
          std::string s;
          for (double x : *p) {
            if (!s.empty()) s += ' ';
            s += number(x);
          }
          return s;
        } else {
          std::string s;
          for (const auto& x : *p) s += (s.empty() ? "" : " ") + x;
          return s;
        }
      },
      spec.field(cfg));
}

const char* flag_type_name(const FlagSpec& spec) {
  Config c;
  return std::visit(
      [](auto* p) -> const char* {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, OptInt>) return "INT";
        else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, OptFloat>) return "FLOAT";
        else if constexpr (std::is_same_v<T, FloatList>) return "FLOAT";  // (CLI11 adds " ..." for a list)
        else if constexpr (std::is_same_v<T, StringList>) return "LIST";
        else return "TEXT";
      },
      spec.field(c));
}

bool flag_is_bool(const FlagSpec& spec) {
  Config c;
  return std::holds_alternative<bool*>(spec.field(c));
}

bool flag_is_list(const FlagSpec& spec) {
  Config c;
  const FieldPtr field = spec.field(c);
  return std::holds_alternative<StringList*>(field) || std::holds_alternative<FloatList*>(field);
}

void set_flag_from_string(Config& cfg, const FlagSpec& spec, const std::string& value, const std::string& source) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          *p = parse_bool_text(spec.name, value, source);
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, OptInt>) {
          *p = parse_int(spec, value, source);
        } else if constexpr (std::is_same_v<T, double> || std::is_same_v<T, OptFloat>) {
          *p = parse_float(spec, value, source);
        } else if constexpr (std::is_same_v<T, OptString>) {
          // An empty value clears an optional path ("--load ''" drops a recipe's --load).
          if (value.empty()) p->reset(); else *p = check_choice(spec, value, source);
        } else if constexpr (std::is_same_v<T, std::string>) {
          *p = check_choice(spec, value, source);
        } else {
          // A list given as one string: "0.3 a 0.7 b" (Megatron's shell-expanded form).
          std::vector<std::string> items;
          std::string tok;
          std::istringstream in(value);
          while (in >> tok) items.push_back(tok);
          set_flag_from_list(cfg, spec, items, source);
        }
      },
      spec.field(cfg));
}

void set_flag_from_list(Config& cfg, const FlagSpec& spec, const std::vector<std::string>& values,
                        const std::string& source) {
  auto field = spec.field(cfg);
  if (auto* p = std::get_if<StringList*>(&field)) {
    for (const auto& v : values) check_choice(spec, v, source);
    **p = values;
    return;
  }
  if (auto* p = std::get_if<FloatList*>(&field)) {
    FloatList numbers;
    for (const auto& v : values) numbers.push_back(parse_float(spec, v, source));
    **p = numbers;
    return;
  }
  if (spec.name == "no-rope-freq" && values.empty()) {  // (an empty list: no layer without RoPE, as Megatron's falsy [])
    unset_flag(cfg, spec, source);
    return;
  }
  if (spec.name == "window-size" && values.size() == 2) {  // (a YAML list [LEFT, RIGHT])
    set_flag_from_string(cfg, spec, values[0] + "," + values[1], source);
    return;
  }
  if (spec.name == "moe-layer-freq" || spec.name == "no-rope-freq" || spec.name == "window-attn-skip-freq") {  // (a YAML list of 0/1 per layer: the pattern "[0,1,...]")
    std::string pattern = "[";
    for (const auto& v : values) pattern += (pattern.size() > 1 ? "," : "") + v;
    set_flag_from_string(cfg, spec, pattern + "]", source);
    return;
  }
  if (values.size() == 1) {
    set_flag_from_string(cfg, spec, values[0], source);
    return;
  }
  throw ConfigError(where(spec, source) + ": takes one value, got " + std::to_string(values.size()));
}

void unset_flag(Config& cfg, const FlagSpec& spec, const std::string& source) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, OptInt> || std::is_same_v<T, OptFloat> || std::is_same_v<T, OptString>) {
          p->reset();
        } else if constexpr (std::is_same_v<T, StringList> || std::is_same_v<T, FloatList>) {
          p->clear();
        } else {
          throw ConfigError(where(spec, source) + ": needs a value, got null");
        }
      },
      spec.field(cfg));
}

}  // namespace mt
