// config.h: the typed configuration megatrain runs with. Field names follow Megatron's flags
// (--num-layers -> model.num_layers); defaults are Megatron's. Optional fields are "unset" in Megatron
// (None) and get derived values in resolve(). The flag table that binds names to fields is flags.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace mt {

using OptInt = std::optional<int64_t>;
using OptFloat = std::optional<double>;
using OptString = std::optional<std::string>;
using StringList = std::vector<std::string>;
using FloatList = std::vector<double>;

struct ModelConfig {
  OptInt num_layers;
  OptInt hidden_size;
  OptInt num_attention_heads;
  OptInt ffn_hidden_size;  // 4h, or int(4h*2/3/64)*64 with SwiGLU
  OptInt kv_channels;      // h / heads
  bool group_query_attention = false;
  int64_t num_query_groups = 1;
  bool swiglu = false;
  std::string normalization = "LayerNorm";
  double norm_epsilon = 1e-5;
  std::string position_embedding_type = "learned_absolute";
  double rotary_base = 10000;
  bool use_rope_scaling = false;     // LLaMA 3.1's RoPE frequency scaling
  double rope_scaling_factor = 8.0;  // its factor (Megatron: low 1, high 4, original 8192 fixed)
  OptInt rotary_seq_len_interpolation_factor;  // RoPE's linear position interpolation: positions divided by it
  // YaRN (--position-embedding-type yarn, Megatron's YarnRotaryEmbedding): --rotary-scaling-factor, the original context,
  // beta fast/slow, --mscale / --mscale-all-dim and the correction range's rounding (kernels/rope_frequencies.h).
  double rotary_scaling_factor = 1.0;
  OptInt yarn_original_max_position_embeddings;  // (default 4096)
  OptFloat yarn_beta_fast, yarn_beta_slow;        // (default 32, 1)
  double mscale = 1.0, mscale_all_dim = 0.0;
  bool yarn_correction_range_round_to_int = false, no_yarn_correction_range_round_to_int = false;  // (neither: rounded)
  // Sliding-window attention (config/attention_window.h): Megatron's "LEFT,RIGHT" tuple and the layers that have it
  OptString window_size, window_attn_skip_freq;
  // Attention's softmax (Megatron's --softmax-type): vanilla, off-by-one (a sink logit 0 in every row's denominator) or
  // learnable (a trained sink logit per head: GPT-OSS's attention sinks).
  std::string softmax_type = "vanilla";
  // Multi-latent attention (DeepSeek-V2/V3's, Megatron's --multi-latent-attention; docs/mla.md): the queries through a
  // q_lora_rank bottleneck (or one projection without it), keys and values from one shared kv_lora_rank latent; each
  // query and key head qk_head_dim wide without RoPE and qk_pos_emb_head_dim with it (the key's RoPE part one per token,
  // shared by the heads), each value head v_head_dim wide. rope_type: MLA's RoPE, rope or yarn (unset: yarn, Megatron's).
  bool multi_latent_attention = false;
  OptInt q_lora_rank;
  int64_t kv_lora_rank = 32, qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  OptString rope_type;
  bool cache_mla_latents = false, mla_down_proj_fusion = false;
  // Multi-token prediction (DeepSeek-V3's; Megatron's --mtp-num-layers, docs/mtp.md): that many extra modules after the
  // decoder, module k predicting the token k + 1 places ahead from module k - 1's hidden state and the embedding of the token
  // k places ahead; their mean losses times mtp_loss_scaling_factor / mtp_num_layers join the training loss.
  OptInt mtp_num_layers;
  double mtp_loss_scaling_factor = 0.1;
  OptString no_rope_freq;  // the layers without RoPE (Llama 4's): N (every N-th) or a 0/1 list; unset: none (config/layer_pattern.h)
  double rotary_percent = 1.0;
  OptInt max_position_embeddings;
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;
  bool add_qkv_bias = false;  // the QKV layers' biases even with --disable-bias-linear (Qwen's)
  int64_t make_vocab_size_divisible_by = 128;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_method_std = 0.02;
  std::string transformer_impl = "transformer_engine";
  std::string attention_backend = "auto";
  bool apply_query_key_layer_scaling = false;
  bool apply_layernorm_1p = false;  // zero-centred norm weights: the norms scale by 1 + weight
  // Megatron switches megatrain checks against the rest of the configuration (flags.cpp, train/capabilities.cpp).
  bool no_position_embedding = false, no_bias_gelu_fusion = false;
  bool qk_layernorm = false;
  bool openai_gelu = false;         // Megatron: the tanh GELU (what megatrain computes for GELU always)
  bool squared_relu = false;        // the MLP's activation relu(x)^2
  // Megatron's quick GeGLU (GPT-OSS's): a gated MLP whose gate goes through x sigmoid(1.702 x); --glu-linear-offset adds
  // to the linear half, --activation-func-clamp-value clamps the gate from above and the linear half both ways
  // (config/gated_activation.h).
  bool quick_geglu = false;
  double glu_linear_offset = 0.0;
  OptFloat activation_func_clamp_value;
  bool rotary_interleaved = false;  // RoPE on interleaved channel pairs (2i, 2i + 1) instead of halves
  OptInt vocab_size;
  OptInt padded_vocab_size;         // the embedding's rows as given (else the vocabulary padded by --make-vocab-size-divisible-by x TP)
  bool no_pad_vocab_size = false;   // Megatron's --no-pad-vocab-size: the embedding's rows are the tokenizer's vocabulary
};

// The MLP is gated (fc1 writes a gate and a linear half): SwiGLU or quick GeGLU.
inline bool gated_mlp(const ModelConfig& m) { return m.swiglu || m.quick_geglu; }
// SwiGLU itself: no offset, no clamp (what the CUDA engine's FP8 casts fuse with).
inline bool plain_swiglu(const ModelConfig& m) {
  return m.swiglu && !m.quick_geglu && m.glu_linear_offset == 0.0 && !m.activation_func_clamp_value;
}

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  OptInt expert_tensor_parallel_size;  // defaults to TP
  bool sequence_parallel = false;
  OptInt num_layers_per_virtual_pipeline_stage;
  OptInt num_virtual_stages_per_pipeline_rank;
  OptInt microbatch_group_size_per_vp_stage;
  OptString pipeline_model_parallel_layout;  // Megatron's explicit layout of the (virtual) stages (config/pipeline_layout.h)  // the interleaved schedule's microbatches per virtual-stage group (default PP)
  OptInt decoder_first_pipeline_num_layers;
  OptInt decoder_last_pipeline_num_layers;
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  std::string pipeline_schedule = "1f1b";  // megatrain: 1f1b (interleaved with virtual stages) or zb-h1
  std::string cp_comm_type = "p2p";
  bool use_tp_pp_dp_mapping = false;
  std::string distributed_backend = "nccl";
  int64_t distributed_timeout_seconds = 60;  // megatrain: bound on waiting for a failed rank
};

struct TrainingConfig {
  OptInt micro_batch_size;
  OptInt global_batch_size;  // MBS * DP
  StringList rampup_batch_size;
  OptString step_batch_size_schedule;  // Megatron's "THRESHOLD:BATCH ..." (config/batch_steps.h; not with global_batch_size)
  OptInt eval_global_batch_size, eval_micro_batch_size;  // evaluation's batch (default: training's)
  OptInt train_iters;
  OptInt train_samples;
  std::string optimizer = "adam";
  OptFloat lr;
  double min_lr = 0.0;
  OptFloat decoupled_lr, decoupled_min_lr;  // the embedding's and output layer's own peak and final rates
  double weight_decay = 0.01;
  bool apply_wd_to_qk_layernorm = false;  // weight decay on the QK norms' weights and biases too (Qwen3-Next's)
  double clip_grad = 1.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  std::string lr_decay_style = "linear";
  OptInt lr_decay_iters;
  OptInt lr_decay_samples;
  int64_t lr_warmup_iters = 0;
  OptFloat lr_warmup_fraction;
  OptInt lr_warmup_samples;
  double lr_warmup_init = 0.0;
  OptInt lr_wsd_decay_iters;
  std::string lr_wsd_decay_style = "exponential";
  bool use_distributed_optimizer = false;
  // Megatron's partial distributed optimizer: the state sharded within each of this many contiguous slices of DP x CP
  // (an instance), the gradients reduce-scattered there and their shards all-reduced across the instances.
  int64_t num_distributed_optimizer_instances = 1;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  OptInt ddp_bucket_size;
  int64_t seed = 1234;
  bool optimizer_cpu_offload = false;
  // Megatron's precision-aware optimizer (Transformer Engine's FusedAdam): the state's storage types. Adam's moments in
  // fp32 or bf16 (stored rounded to nearest even, computed in fp32); fp32 gradients and master weights.
  bool use_precision_aware_optimizer = false;
  std::string main_grads_dtype = "fp32", main_params_dtype = "fp32", exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32";
  double optimizer_offload_fraction = 1.0;  // the share of the optimizer state (by elements, in parameter order) offloaded
  bool overlap_cpu_optimizer_d2h_h2d = false;  // Megatron's; megatrain's offload always overlaps its transfers
  OptInt exit_interval;           // stop (after saving) when iteration % N == 0
  bool calculate_per_token_loss = false;  // the loss over the global batch's tokens, not averaged per microbatch
  bool deterministic_mode = false;        // bitwise-repeatable runs (the CPU engine always is)
  bool test_mode = false;  // Megatron's real-time test: the query / key norms compared across the DP and TP replicas
  OptInt exit_duration_in_mins;   // stop (after saving) once training has run this many minutes (on any rank)
  int64_t exit_on_nan_count = 5;  // megatrain: stop after this many non-finite steps in a row
};

struct PrecisionConfig {
  bool bf16 = false;
  bool fp16 = false;
  OptFloat loss_scale;  // dynamic when unset
  double initial_loss_scale = 4294967296.0;
  double min_loss_scale = 1.0;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool fp32_residual_connection = false;  // the CUDA engine's residual stream in fp32 instead of 16 bits
  OptString fp8_format;
  std::string fp8_recipe = "delayed";
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";
  int64_t fp8_margin = 0;                  // delayed scaling: scales 2^margin below the amax's
  bool no_fp8_wgrad = false;               // the weight-gradient GEMMs in 16 bits
  bool tp_only_amax_red = false;           // delayed scaling: amaxes reduced over TP x CP only (not DP)
  bool fp8_param_gather = false;           // Megatron's FP8 weights in the all-gather (refused: not implemented)
  bool first_last_layers_bf16 = false;     // the first / last layers' linears in 16 bits under FP8
  int64_t num_layers_at_start_in_bf16 = 1;
  int64_t num_layers_at_end_in_bf16 = 1;
  bool grad_reduce_in_bf16 = false;
  bool ddp_reduce_scatter_with_fp32_accumulation = false;  // Megatron's: bf16 on the wire, summed in fp32 (not with bf16 reductions here)
};

struct RecomputeConfig {
  OptString recompute_granularity;
  OptString recompute_method;
  OptInt recompute_num_layers;
  StringList recompute_modules = {"core_attn"};
  // Megatron's deprecated --moe-layer-recompute: resolve() turns it into --recompute-granularity selective with "moe"
  // among the modules, as Megatron's TransformerConfig does.
  bool moe_layer_recompute = false;
  // Selective recompute of `module` (resolved: granularity selective, the module among recompute_modules).
  bool recomputes(const std::string& module) const {
    return recompute_granularity.value_or("") == "selective" && std::find(recompute_modules.begin(), recompute_modules.end(), module) != recompute_modules.end();
  }
};

// The auxiliary losses in Megatron's order (its router applies and logs them so), with their log names.
inline constexpr const char* kAuxLossTypes[3] = {"aux_loss", "seq_aux_loss", "global_aux_loss"};
inline constexpr const char* kAuxLossNames[3] = {"load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss"};

struct MoeConfig {
  OptInt num_experts;
  int64_t moe_router_topk = 2;
  OptInt moe_ffn_hidden_size;
  // Megatron's pattern: an integer N (every N-th layer from layer 0 is MoE) or a list expression such as
  // "[0]+[1]*3" or "([0]*3+[1])*2" with one 0/1 per layer (model/moe_pattern.h parses it).
  std::string moe_layer_freq = "1";
  // One type, or Megatron's list form: several auxiliary losses at once, --moe-aux-loss-coeff giving one coefficient each
  // (aux_loss_coeff() reads them as Megatron's get_aux_loss_coeff).
  StringList moe_router_load_balancing_type = {"aux_loss"};
  FloatList moe_aux_loss_coeff = {0.0};
  OptFloat moe_z_loss_coeff;
  std::string moe_token_dispatcher_type = "allgather";
  // The flex dispatcher's backend (Megatron's kernels for it; megatrain dispatches flex by its own all-to-all) and its
  // deprecated switch, kept for Megatron's checks.
  std::string moe_flex_dispatcher_backend = "deepep";
  bool moe_enable_deepep = false;
  bool moe_grouped_gemm = false;
  OptFloat moe_expert_capacity_factor;
  bool moe_router_pre_softmax = false;
  OptInt moe_shared_expert_intermediate_size;
  bool moe_shared_expert_overlap = false;
  std::string moe_router_score_function = "softmax";
  std::string moe_router_dtype = "fp32";
  OptFloat moe_router_topk_scaling_factor;
  OptInt moe_router_num_groups;
  OptInt moe_router_group_topk;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-router-load-balancing-type quantile_balancing: qb_beta = ema * qb_beta + (1 - ema) * the global batch's quantile.
  double moe_router_quantile_balancing_ema = 0.0;
  std::string moe_token_drop_policy = "probs";
  bool moe_pad_expert_input_to_capacity = false;
  bool moe_permute_fusion = false;
  bool moe_per_layer_logging = false;     // TensorBoard: each layer's auxiliary losses (moe/<name>_layer_<i>)
  bool moe_apply_probs_on_input = false;  // the routing weight scales the expert's input, not its output (Llama 4; top-1)
  bool moe_router_force_load_balancing = false;  // benchmarking: random router logits (N(0, 1)), the gradient straight through
  bool moe_shared_expert_gate = false;  // the shared expert's output times sigmoid(x . g), g a [1, h] weight (Qwen2-MoE)
  OptFloat moe_input_jitter_eps;  // the router's input times noise uniform in [1 - eps, 1 + eps] (model/moe_input_jitter.h)
  // Megatron's upcycling: --load holds a dense model's checkpoint, whose MLPs become the experts (checkpoint/upcycle.h);
  // the granularity: how many experts' widths make one dense MLP (1: each expert a copy of it).
  bool moe_use_upcycling = false;
  int64_t moe_upcycling_granularity = 1;

  // The coefficient of one auxiliary loss (aux_loss, seq_aux_loss or global_aux_loss), as Megatron's get_aux_loss_coeff:
  // with one type, --moe-aux-loss-coeff's value when the type is that one; with a list, the coefficient at its position.
  // 0 when the type is not chosen.
  double aux_loss_coeff(const std::string& type) const {
    if (std::none_of(std::begin(kAuxLossTypes), std::end(kAuxLossTypes), [&](const char* t) { return type == t; })) {
      return 0.0;  // (none, sinkhorn, quantile_balancing: no aux loss)
    }
    for (size_t i = 0; i < moe_router_load_balancing_type.size(); ++i) {
      if (moe_router_load_balancing_type[i] != type) continue;
      if (moe_router_load_balancing_type.size() == 1) return moe_aux_loss_coeff.size() == 1 ? moe_aux_loss_coeff[0] : 0.0;
      return i < moe_aux_loss_coeff.size() ? moe_aux_loss_coeff[i] : 0.0;
    }
    return 0.0;
  }
  // Whether the routing's balancing is this one type alone (sinkhorn, quantile_balancing, none, ...).
  bool load_balancing_is(const std::string& type) const {
    return moe_router_load_balancing_type.size() == 1 && moe_router_load_balancing_type[0] == type;
  }
};


struct DataConfig {
  StringList data_path;
  std::string split = "969,30,1";
  StringList train_data_path;
  StringList valid_data_path;
  StringList test_data_path;
  bool mock_data = false;
  OptString text_data_path;  // megatrain: a plain text file, byte-level tokens
  OptInt seq_length;
  OptString data_cache_path;
  int64_t num_workers = 2;
  std::string dataloader_type = "single";
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool no_create_attention_mask = false;  // Megatron's --no-create-attention-mask-in-dataloader (refused with the line above)
  OptString tokenizer_type;
  OptString vocab_file;
  OptString merge_file;
  OptString tokenizer_model;
  OptInt null_tokenizer_eod_id;       // NullTokenizer's end of document (default: --vocab-size, its extra id)
  int64_t null_tokenizer_pad_id = -1;  // NullTokenizer's padding id: labels equal to it take no loss (-1: none)
  bool allow_ambiguous_pad_tokens = false;  // a padding id equal to the end of document still masks (Megatron's opt-in)
  int64_t vocab_extra_ids = 0;         // T5's sentinel tokens (only 0: megatrain trains decoder-only models)
};

struct CheckpointConfig {
  OptString save;
  OptString load;
  OptInt save_interval;
  OptInt ckpt_step;
  bool no_save_optim = false;
  bool no_save_rng = false;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;
  std::string ckpt_format = "torch_dist";
  bool async_save = false;
  bool use_checkpoint_args = false;
  // At a resume, Megatron's scheduler checks the command's schedule against the checkpoint's (schedule_on_load.h).
  bool override_opt_param_scheduler = false;        // this command's schedule
  bool use_checkpoint_opt_param_scheduler = false;  // the checkpoint's
  int64_t ckpt_keep_last = 0;  // megatrain: keep only the newest N checkpoints (0: all)
  OptInt save_retain_interval;  // Megatron's: keep the checkpoints of its multiples and the newest (the others deleted)
};

struct LoggingConfig {
  int64_t log_interval = 100;
  bool log_throughput = false;
  bool log_params_norm = false;
  bool log_num_zeros_in_grad = false;  // Megatron's count_zeros_fp32 of the step's gradients (StepReport::num_zeros)
  OptString tensorboard_dir;
  int64_t tensorboard_log_interval = 1;
  int64_t tensorboard_queue_size = 1000;
  bool log_batch_size_to_tensorboard = false;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_world_size_to_tensorboard = false;
  bool log_timers_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool no_log_learning_rate_to_tensorboard = false;
  bool no_log_loss_scale_to_tensorboard = false;
  OptString wandb_project;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 100;
  int64_t timing_log_level = 0;
  bool profile = false;
  OptString log_dir;  // megatrain: JSON-lines metrics file goes here
  std::string device = "auto";  // megatrain: auto | cpu | cuda
};

// Values computed from the flags and the world size (not flags themselves).
struct Derived {
  int64_t world_size = 1;
  int64_t data_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 1;
  int64_t expert_data_parallel_size = 1;
  int64_t global_batch_size = 1;
  int64_t num_microbatches = 1;
  // Evaluation's: --eval-global-batch-size / --eval-micro-batch-size, else training's (Megatron's defaults)
  int64_t eval_global_batch_size = 1, eval_micro_batch_size = 1, eval_num_microbatches = 1;
  int64_t vocab_size = 0;          // the tokenizer's (or --vocab-size)
  int64_t padded_vocab_size = 0;   // ceil(V / (divisible-by * TP)) * divisible-by * TP
  int64_t num_query_groups = 1;    // effective: one per head without GQA
  std::vector<int64_t> layers_per_stage;  // transformer layers on each pipeline stage
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainingConfig training;
  PrecisionConfig precision;
  RecomputeConfig recompute;
  MoeConfig moe;
  DataConfig data;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  Derived derived;
  std::vector<std::string> notes;  // one-line notes (old spellings mapped, ...) to print once
};

}  // namespace mt
