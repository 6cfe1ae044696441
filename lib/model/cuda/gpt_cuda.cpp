// gpt_cuda.cpp: the CUDA model's set-up (parameters from the shared layout, activation buffers, the TP
// arena, the split-layer decision) and the small state every pass reads (dropout descriptors, attention shapes and
// seeds, document biases). The rest: gpt_cuda_streams.cpp (TP row combines and gathers, the side streams),
// gpt_cuda_step.cpp (embedding, loss, the microbatch's forward and backward), gpt_cuda_units.cpp (a layer's
// units), gpt_cuda_layer.cpp and gpt_cuda_split.cpp (their schedules: all rows, or two interleaved halves under TP).
#include "model/cuda/gpt_cuda_state.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cpu/router.h"
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/context_a2a.h"
#include "kernels/cuda/cross_entropy_bf16.h"
#include "kernels/cuda/document_bias.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_bf16.h"
#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/qkv_layout.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/attention_sink.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "plan/memory_model.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/cuda/op_profiler.h"
#include "tensor/rng.h"

namespace mt {

float* CudaGPT::block_scales(int64_t n) {
  void* p = alloc(static_cast<size_t>(n) * 4);
  if (arena_mode_ != ArenaMode::kCount) MT_CUDA_CHECK(cudaMemset(p, 0, static_cast<size_t>(n) * 4));  // (the padding, never written)
  return static_cast<float*>(p);
}

void* CudaGPT::alloc(size_t bytes) {
  if (arena_mode_ != ArenaMode::kOff) {
    // 256-byte steps, as cudaMalloc aligns (cuBLASLt's plans and the halves' rows assume it).
    const size_t off = arena_used_, step = (std::max<size_t>(bytes, 16) + 255) / 256 * 256;
    arena_used_ += step;
    if (arena_mode_ == ArenaMode::kCount) return reinterpret_cast<void*>(static_cast<uintptr_t>(256 + off));  // never read
    if (arena_used_ > arena_size_) throw std::logic_error("CudaGPT: the activation arena is smaller than its count");
    return arena_ + off;  // the window goes with the TP communicator
  }
  void* p = device_malloc(std::max<size_t>(bytes, 16), "the model's weights, gradients and activations");
  owned_.push_back(p);
  return p;
}

CudaGPT::CudaGPT(const Config& cfg, const ParamStore& layout, const ModelLayout& where, cudaStream_t stream, StreamCollectives* tp,
                 bool keep_master, StreamCollectives* dp, int64_t max_in_flight, const CudaGPT* share_params)
    : D_(model_dims(cfg, tp ? tp->group_rank() : 0, tp ? tp->group_size() : 1, where.ep_rank, where.ep_size, where.etp_rank, where.etp_size)),
      stream_(stream),
      dt_(cfg.precision.fp16 ? cuda::F16::kFP16 : cuda::F16::kBF16),
      ab_(cfg.precision.fp16 ? CUDA_R_16F : CUDA_R_16BF),
      wire_(cfg.precision.fp16 ? WireType::kF16 : WireType::kBF16),
      res16_(!cfg.precision.fp32_residual_connection),
      norm_offset_(D_.norm_1p ? 1.0f : 0.0f),
      hidden_dropout_(static_cast<float>(cfg.model.hidden_dropout)) {
  const ModelDims& D = D_;
  if (max_in_flight < 1) throw std::logic_error("CudaGPT: max_in_flight must be at least 1");
  // --deterministic-mode: cuDNN's attention backward without its atomic dQ accumulator (kernels/cuda/sdpa_cudnn.h), and
  // every GEMM on cuBLASLt's first heuristic algorithm (a fixed choice for the shape and GPU; the timed autotuning could
  // pick another algorithm, another order of sums, in another process); the engine's own kernels are deterministic either
  // way (fixed-order reductions; integer counts where atomics add). cuDNN's deterministic backward without the
  // accumulator is the frontend's algorithm on Hopper; Blackwell's needs other engines and knobs: refused there.
  cuda::CudnnSdpa::instance().set_deterministic(cfg.training.deterministic_mode);
  if (cfg.training.deterministic_mode) {
    int device = 0;
    cudaDeviceProp prop{};
    MT_CUDA_CHECK(cudaGetDevice(&device));
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major != 9) {
      throw std::runtime_error("--deterministic-mode on the CUDA engine runs on Hopper GPUs (compute capability 9.x) only, this one is " +
                               std::to_string(prop.major) + "." + std::to_string(prop.minor) + ": drop it, or use --device cpu (always bitwise repeatable)");
    }
    cuda::GemmLt::instance().set_autotune(false);
  }
  // MoE: every expert local, or split over EP (set_expert_parallel); under TP the experts split over expert-TP = TP, the
  // MoE layer running on the TP group's gathered rows as the dense MLP does (gpt_cuda_moe.cpp). With expert-TP other than
  // TP each rank's experts take the rows of its own slice of the tokens, gathered over an expert-TP group of more than
  // one rank (set_expert_tensor_parallel; gpt_cuda_expert_tensor_parallel.cpp).
  if (cfg.moe.num_experts && D.etp != D.tp) {
    if (D.tp > 1 && !D.sequence_parallel) throw std::logic_error("CudaGPT: MoE layers under TP without sequence parallelism (refused by validation)");
    if (D.fp8 || cfg.moe.moe_apply_probs_on_input || D.cp > 1) {
      throw std::logic_error("CudaGPT: expert-TP other than TP with FP8, --moe-apply-probs-on-input or CP (refused by the capability checks)");
    }
    moe_own_rows_ = D.tp > 1;  // (at TP 1 every row is this rank's)
    moe_etp_gathers_ = D.etp > 1;
  }
  if (D.tp > 1) {
    tp_ = tp;
    tp_size_ = D.tp;
    tp_rank_ = D.tp_rank;
    sp_ = D.sequence_parallel;
    v0_ = D.tp_rank * D.V_local;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&wgrad_stream_, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&proj_done_ev_, cudaEventDisableTiming));
    // K/V replication (query groups below TP, as Megatron and the CPU model): the ranks of one group hold
    // the same QKV shard; each computes nh_local of its query heads, and their gradients are summed.
    if (D.kv_rep > 1) kv_group_ = tp->stream_sub_group(static_cast<int>(D.tp_rank / D.kv_rep), static_cast<int>(D.tp_rank), "kv-replica");
  }
  numel_ = layout.numel();
  // Every parameter is a view into the flat buffers; cuBLASLt's kernels load 16-byte vectors, so each view
  // must start on a multiple of 8 elements: ParamStore::allocate places them so.
  static_assert(kParamAlignment % 8 == 0, "the CUDA engine's views need 16-byte starts");
  for (const auto& p : layout.infos()) {
    if (p.offset % kParamAlignment != 0) throw std::logic_error("CudaGPT: " + p.name + " starts off the flat buffers' alignment");
  }
  if (share_params) {
    // Another model chunk of this stage (interleaving): the parameters, gradients and master weights of every
    // chunk are one set of flat buffers, the first chunk's; this one reads and writes its own offsets in them.
    if (share_params->numel_ != numel_) throw std::logic_error("CudaGPT: chunks sharing parameters need the same layout");
    master_ = share_params->master_;
    grads_ = share_params->grads_;
    w16_ = share_params->w16_;
  } else {
    if (keep_master) master_ = static_cast<float*>(alloc(static_cast<size_t>(numel_) * 4));
    // With data parallelism the gradients sit in the DP group's symmetric windows, where it has them (its
    // reductions run on them; same size on every rank), and so do the 16-bit weights when they are gathered
    // (the distributed optimizer, which keeps no master copy here).
    auto param_buffer = [&](size_t bytes) {
      void* p = dp ? dp->alloc_window(bytes) : nullptr;
      return p ? p : alloc(bytes);
    };
    grads_ = static_cast<float*>(param_buffer(static_cast<size_t>(numel_) * 4));
    w16_ = static_cast<bf16*>(keep_master ? alloc(static_cast<size_t>(numel_) * 2) : param_buffer(static_cast<size_t>(numel_) * 2));
    // The initial values go up through the master buffer, or through the gradient buffer when there is none.
    float* up = keep_master ? master_ : grads_;
    MT_CUDA_CHECK(cudaMemcpyAsync(up, layout.params().f32(), static_cast<size_t>(numel_) * 4, cudaMemcpyHostToDevice, stream_));
    cuda::cast_to_bf16(w16_, up, numel_, stream_, dt_);
    MT_CUDA_CHECK(cudaMemsetAsync(grads_, 0, static_cast<size_t>(numel_) * 4, stream_));
  }

  // A pipeline stage: its layers, the embedding on the first stage, the final norm, output layer and loss on
  // the last (the whole model on one).
  pre_ = where.pre_process;
  post_ = where.post_process;
  L_ = static_cast<int64_t>(where.layers.size());
  first_layer_ = where.layers_range.first;
  if (L_ == 0) {
    throw std::runtime_error("the CUDA engine needs at least one transformer layer on every pipeline stage: change the split "
                             "(--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split) or use --device cpu");
  }
  // Flat offsets of the layout's parameters (-1: the model has none).
  auto offset = [&](size_t i) { return i == kNoParam ? int64_t{-1} : layout.info(i).offset; };
  wte_ = offset(where.word_embeddings);
  wpe_ = offset(where.position_embeddings);
  lnf_w_ = offset(where.final_norm_w);
  lnf_b_ = offset(where.final_norm_b);
  out_w_ = offset(where.output_w);
  layers_.resize(static_cast<size_t>(L_));
  layer_replicated_.resize(static_cast<size_t>(L_));
  for (int64_t l = 0; l < L_; ++l) {
    const LayerParams& ly = where.layers[static_cast<size_t>(l)];
    LayerW& lw = layers_[static_cast<size_t>(l)];
    lw.ln1_w = offset(ly.input_norm_w);
    lw.ln1_b = offset(ly.input_norm_b);
    lw.ln2_w = offset(ly.mlp_norm_w);
    lw.ln2_b = offset(ly.mlp_norm_b);
    lw.qkv_w = offset(ly.qkv_w);
    lw.qkv_b = offset(ly.qkv_b);
    lw.proj_w = offset(ly.proj_w);
    lw.proj_b = offset(ly.proj_b);
    lw.fc1_w = offset(ly.fc1_w);
    lw.fc1_b = offset(ly.fc1_b);
    lw.fc2_w = offset(ly.fc2_w);
    lw.fc2_b = offset(ly.fc2_b);
    lw.qn_w = offset(ly.q_norm_w);
    lw.qn_b = offset(ly.q_norm_b);
    lw.kn_w = offset(ly.k_norm_w);
    lw.kn_b = offset(ly.k_norm_b);
    lw.sink = offset(ly.softmax_offset);
    lw.q_proj_w = offset(ly.q_proj_w);
    lw.q_down_w = offset(ly.q_down_w);
    lw.q_ln_w = offset(ly.q_latent_norm_w);
    lw.q_ln_b = offset(ly.q_latent_norm_b);
    lw.q_up_w = offset(ly.q_up_w);
    lw.kv_down_w = offset(ly.kv_down_w);
    lw.kv_ln_w = offset(ly.kv_latent_norm_w);
    lw.kv_ln_b = offset(ly.kv_latent_norm_b);
    lw.kv_up_w = offset(ly.kv_up_w);
    int64_t lo = numel_, hi = 0;  // the layer's dense parameters (an MoE layer's experts sit in the expert range)
    for (size_t i = ly.first; i < ly.end; ++i) {
      if (layout.info(i).tp_replicated()) layer_replicated_[static_cast<size_t>(l)].emplace_back(layout.info(i).offset, layout.info(i).numel);
      if (layout.info(i).grad_group != GradGroup::kDense || !layout.info(i).trainable) continue;
      lo = std::min(lo, layout.info(i).offset);
      hi = std::max(hi, layout.info(i).offset + layout.info(i).numel);
    }
    layer_start_.push_back(lo);
    layer_end_.push_back(hi);
    if (ly.moe) {
      lw.moe = true;
      lw.router_w = offset(ly.router_w);
      lw.router_b = offset(ly.router_b);
      for (const auto& ex : ly.experts) {
        lw.expert_fc1.push_back(offset(ex.fc1_w));
        lw.expert_fc2.push_back(offset(ex.fc2_w));
        lw.expert_fc1_b.push_back(offset(ex.fc1_b));
        lw.expert_fc2_b.push_back(offset(ex.fc2_b));
      }
      lw.shared_fc1_w = offset(ly.shared_fc1_w);
      lw.shared_fc2_w = offset(ly.shared_fc2_w);
      if (ly.shared_gate_w != kNoParam) lw.shared_gate_w = offset(ly.shared_gate_w);
      lw.moe_index = moe_layers_++;
      if (ly.expert_bias != kNoParam) expert_bias_offsets_.push_back(layout.info(ly.expert_bias).offset);
      if (ly.quantile_bias != kNoParam) quantile_bias_offsets_.push_back(layout.info(ly.quantile_bias).offset);
    }
  }
  embed_end_ = pre_ ? layout.info(where.embedding_end - 1).offset + layout.info(where.embedding_end - 1).numel : 0;
  for (size_t i : {where.final_norm_w, where.final_norm_b}) {
    if (i != kNoParam) final_replicated_.emplace_back(layout.info(i).offset, layout.info(i).numel);
  }
  if (moe_layers_ > 0) setup_moe(cfg.moe, layout, max_in_flight, static_cast<uint64_t>(cfg.training.seed));
  if (D.rope || D.mla) {  // (MLA rotates its own part whatever the model's position embedding)
    const auto table = cuda::rope_table(D.max_pos, D.rot_dim, static_cast<double>(D.rope_base), D.rope_scaling);
    rope_table_ = static_cast<float*>(alloc(table.size() * 4));
    MT_CUDA_CHECK(cudaMemcpy(rope_table_, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  }
  doc_mask_ = cfg.data.reset_attention_mask;
  if (doc_mask_ && (D.cp == 1 || D.cp_a2a)) {  // (the ring builds each block's bias instead: ring_bias)
    doc_bias_rows_ = *cfg.training.micro_batch_size;
    if (share_params != nullptr && share_params->doc_bias_ != nullptr && share_params->doc_bias_rows_ >= doc_bias_rows_) {
      doc_bias_ = share_params->doc_bias_;
      doc_bias_serial_ = share_params->doc_bias_serial_;
    } else {
      const auto S = static_cast<size_t>(D.S);
      doc_bias_ = static_cast<bf16*>(alloc(static_cast<size_t>(doc_bias_rows_) * S * S * 2));
    }
  }

  // Recompute: full granularity re-runs whole layers (uniform: every layer from its own input; block: the
  // first --recompute-num-layers layers). Selective keeps nothing extra to drop: flash attention never
  // stores the S x S probabilities and recomputes them in its backward already.
  const auto& rc = cfg.recompute;
  full_recompute_ = rc.recompute_granularity && *rc.recompute_granularity == "full";
  recompute_layer_.assign(static_cast<size_t>(L_), false);
  if (full_recompute_) {
    const bool block = rc.recompute_method && *rc.recompute_method == "block";
    const int64_t n = rc.recompute_num_layers.value_or(1);
    for (int64_t l = 0; l < L_; ++l) recompute_layer_[static_cast<size_t>(l)] = block ? l < n : true;
  }
  // Selective recompute of the MLP blocks: --recompute-modules mlp (dense layers), moe (MoE layers; --moe-layer-recompute).
  mlp_recompute_layer_.assign(static_cast<size_t>(L_), false);
  for (int64_t l = 0; l < L_; ++l) {
    const bool moe = layers_[static_cast<size_t>(l)].moe;
    mlp_recompute_layer_[static_cast<size_t>(l)] = rc.recomputes(moe ? "moe" : "mlp");
    mlp_recompute_ = mlp_recompute_ || mlp_recompute_layer_[static_cast<size_t>(l)];
  }
  // --recompute-modules moe_act: the routed experts' activation recomputed in the backward (expert_act_shared).
  moe_act_recompute_ = rc.recomputes("moe_act");
  // --recompute-modules mla_up_proj: multi-latent attention's up projections, norms and RoPE computed again before each
  // layer's attention backward (mla_up_recompute) from the latents and the rotated k_pe it keeps.
  mla_up_recompute_ = D.mla && rc.recomputes("mla_up_proj");
  if (mlp_recompute_ && D.fp8) throw std::logic_error("CUDA model: --recompute-modules mlp / moe with FP8 (refused by the capability checks)");

  if (!D.swiglu && moe_layers_ > 0 && F_moe_ % 8 != 0) {  // (refused by name in train/capabilities: a guard for other callers)
    throw std::runtime_error("the CUDA engine's GELU and squared-ReLU experts need --moe-ffn-hidden-size to be a multiple of 8 (this model: " +
                             std::to_string(F_moe_) + "): change it, or use --device cpu");
  }
  if (D.fp8 && (D.F_local % 16 != 0 || (D.nh_local * D.d) % 16 != 0 || ((D.nh_local + 2 * D.ng_local) * D.d) % 16 != 0 || D.h % 16 != 0)) {
    throw std::runtime_error("FP8 GEMMs need this rank's FFN width, heads x head dimension and QKV width, and the hidden size, to be multiples "
                             "of 16: change --ffn-hidden-size, the heads or --tensor-model-parallel-size, or use --device cpu");
  }
  if (D.fp8 && tp_size_ > 1 && (moe_layers_ > 0 || D.fp8_blockwise || D.kv_rep > 1)) {
    throw std::logic_error("CUDA model: FP8 under tensor parallelism with MoE layers, blockwise scaling or K/V heads replicated over TP "
                           "(refused by the capability checks)");
  }
  if (D.fp8 && moe_layers_ > 0 && (F_moe_ % 16 != 0 || F_shared_ % 16 != 0 || !D.fp8_wgrad)) {
    throw std::logic_error("CUDA model: FP8 MoE layers need expert widths that are multiples of 16 and FP8 weight gradients "
                           "(refused by the capability checks)");
  }
  if (!D.swiglu && !D.squared_relu && D.F_local % 8 != 0) {
    throw std::runtime_error("the CUDA engine fuses GELU into the fc1 GEMM, which needs --ffn-hidden-size / TP to be a multiple of 8 (this model: " +
                             std::to_string(D.F_local) + "): change --ffn-hidden-size, or use --device cpu");
  }
  // (context parallelism: this rank's two chunks of each sequence)
  S_local_ = D.S / std::max<int64_t>(1, D.cp);
  const int64_t T = *cfg.training.micro_batch_size * S_local_;
  const int64_t balance_groups = moe_seq_aux_ ? *cfg.training.micro_batch_size : 1;  // (the aux loss's: per sequence under seq_aux_loss)
  if (sp_ && T % tp_size_ != 0) {
    throw std::runtime_error("sequence parallelism needs --micro-batch-size x --seq-length divisible by --tensor-model-parallel-size");
  }
  T_max_ = T;
  // The experts' rows of a microbatch: its top-k choices, or padded to capacity every expert's capacity (at most every
  // token, beyond which nothing drops or pads).
  moe_rows_ = T * topk_;
  if (moe_pad_) moe_rows_ = std::max(moe_rows_, experts_ * std::min(T, cpu::expert_capacity(moe_capacity_factor_, T, topk_, experts_)));
  // FP8 experts: each expert's rows start at a multiple of 16, the gaps zero rows (gpt_cuda_moe_fp8.cpp).
  if (D.fp8 && moe_layers_ > 0) {
    // (Under EP the padded blocks travel: gpt_cuda_expert_parallel.cpp. Expert biases with it are refused: the gaps
    // inside an expert's arrived rows would take act(b1) into fc2's amax.)
    if (D.ep > 1 && D.bias) throw std::logic_error("CUDA model: FP8 MoE layers with expert parallelism and biases (refused by the capability checks)");
    moe_row_align_ = 16;
    moe_rows_ += experts_ * (moe_row_align_ - 1);
    f8_moe_width_ = std::max({D.h, D.swiglu ? 2 * F_moe_ : F_moe_, D.swiglu ? 2 * F_shared_ : F_shared_});
  }
  // The output layer's rows at a time (about 512 MiB of logits, as `megatrain plan` counts them);
  // MEGATRAIN_LOSS_CHUNK_ROWS overrides it (0: the whole microbatch at once).
  loss_chunk_rows_ = output_layer_chunk_rows(D.V_local, T);
  if (const char* env = std::getenv("MEGATRAIN_LOSS_CHUNK_ROWS")) {
    const long long v = std::atoll(env);
    if (v < 0) throw std::runtime_error("MEGATRAIN_LOSS_CHUNK_ROWS must be 0 (whole microbatches) or a number of rows");
    loss_chunk_rows_ = v == 0 ? T : std::min<int64_t>(T, v);
  }
  // MEGATRAIN_FP8_FUSED_SWIGLU=0: SwiGLU and delayed scaling's FP8 casts as separate kernels (the same bytes; for A/B
  // measurements and the tests that compare both paths).
  if (const char* env = std::getenv("MEGATRAIN_FP8_FUSED_SWIGLU")) fp8_fused_swiglu_ = std::string(env) != "0";
  if (moe_probs_on_input_) {  // (the combine's weights, all 1: the routing weights went into the experts' inputs)
    const std::vector<float> ones(static_cast<size_t>(T * topk_), 1.0f);
    moe_ones_ = static_cast<float*>(alloc(ones.size() * 4));
    MT_CUDA_CHECK(cudaMemcpy(moe_ones_, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  const double rows_l = sp_ ? 1.0 / static_cast<double>(tp_size_) : 1.0;  // Tl / T
  W_ = {D.nh_local * D.d, D.ng_local * D.d, D.mla ? 0 : (D.qh_local + 2 * D.ng_local) * D.d, D.F_local, D.swiglu ? 2 * D.F_local : D.F_local,
        D.mla ? D.nh_local * D.v_dim : D.ng_local * D.d, D.mla ? D.nh_local * D.v_dim : D.nh_local * D.d};
  if (D.mla && D.cp > 1) throw std::logic_error("CudaGPT: multi-latent attention runs without context parallelism (capabilities refuse it)");
  const int64_t h = D.h, Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq, F = W_.F, F1 = W_.F1, Vd = W_.Vd, Od = W_.Od;
  const int64_t mla_rank = std::max(D.q_lora_rank, D.kv_lora_rank);  // (the widest latent; 0 without MLA)
  const size_t t = static_cast<size_t>(T);
  auto bytes = [&](int64_t n, size_t elem, double rows) { return static_cast<size_t>(static_cast<double>(t) * rows) * static_cast<size_t>(n) * elem; };
  auto b16 = [&](int64_t n, double rows = 1.0) {
    act_bytes_ += bytes(n, 2, rows);
    return static_cast<bf16*>(alloc(bytes(n, 2, rows)));
  };
  auto b16_rows = [&](int64_t n, int64_t rows) {  // a buffer of `rows` rows, not a fraction of T
    const size_t b = static_cast<size_t>(rows) * static_cast<size_t>(n) * 2;
    act_bytes_ += b;
    return static_cast<bf16*>(alloc(b));
  };
  auto u8_rows = [&](int64_t n, int64_t rows) {  // FP8 bytes, `rows` rows
    const size_t b = static_cast<size_t>(rows) * static_cast<size_t>(n);
    act_bytes_ += b;
    return static_cast<uint8_t*>(alloc(b));
  };
  auto f32 = [&](int64_t n, double rows = 1.0) {
    act_bytes_ += bytes(n, 4, rows);
    return static_cast<float*>(alloc(bytes(n, 4, rows)));
  };
  const size_t rb = res16_ ? 2 : 4;
  auto res = [&](int64_t n, double rows) {
    act_bytes_ += bytes(n, rb, rows);
    return alloc(bytes(n, rb, rows));
  };
  // A layer's MLP block's buffers: the dense MLP's for a dense layer, the MoE layer's for an MoE layer.
  // (expert_act_own false: the routed experts' activation in the buffer the layers share, expert_act_shared)
  auto mlp_buffers = [&](Record& r, bool dense_mlp, bool moe, bool fp8, bool expert_act_own) {
    if (dense_mlp) {
      r.fc1 = b16(F1);
      if (!fp8 || !swiglu_output_unread()) r.act = b16(F);  // (FP8 delayed: SwiGLU writes fc2's FP8 input instead)
    }
    if (moe) {
      const double k = static_cast<double>(topk_);
      const int64_t Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
      r.logits = f32(experts_);
      r.route_weight = f32(1, k);
      r.top = reinterpret_cast<int32_t*>(f32(1, k));
      r.row = reinterpret_cast<int32_t*>(f32(1, k));
      r.ex_rows = b16_rows(h, moe_rows_);
      if (!moe_rows_travel()) {  // (expert parallelism, expert-TP's gather: the rows this rank's experts receive, in growing buffers)
        r.ex_fc1 = b16_rows(F1m, moe_rows_);
        // (FP8 delayed scaling with SwiGLU experts without biases: SwiGLU writes fc2's FP8 input, nothing reads a 16-bit one)
        if ((!fp8 || !experts_swiglu_output_unread()) && expert_act_own) r.ex_act = b16_rows(Fm, moe_rows_);
        if ((!fp8 || !experts_swiglu_output_unread()) && !expert_act_own) {
          if (expert_act_shared_ == nullptr) expert_act_shared_ = b16_rows(Fm, moe_rows_);
          r.ex_act = expert_act_shared_;
        }
      }
      r.ex_out = b16_rows(h, moe_rows_);
      if (moe_pad_) r.pad_map = static_cast<int32_t*>(alloc(static_cast<size_t>(2 * moe_rows_) * 4));
      if (F_shared_ > 0) {
        r.sh_fc1 = b16(D.swiglu ? 2 * F_shared_ : F_shared_);
        r.sh_act = b16(F_shared_);
        if (shared_gate_) {
          r.sh_out = b16(h);
          r.sh_gate = f32(1);
        }
      }
      r.aux_dscale = static_cast<float*>(alloc(static_cast<size_t>(balance_groups * experts_) * 4));
    }
  };
  // A layer's record: the dense MLP's buffers for a dense layer, the MoE buffers for an MoE layer (the shared
  // recompute record: whichever the stage's layers need); a layer whose MLP block is recomputed takes mlp_record_'s.
  // Multi-latent attention's up projections' outputs (the queries, keys and values, the normed latents and their norms'
  // statistics): a layer's own, or (--recompute-modules mla_up_proj) those of mla_record_, which every such layer shares.
  auto mla_up_buffers = [&](Record& r) {
    r.q = b16(Hd);
    r.k = b16(KVd);
    r.v = b16(Vd);
    if (D.qk_norm) {
      r.mla_kv_lat = b16(D.kv_lora_rank);
      r.mla_kv_mean = f32(1);
      r.mla_kv_rstd = f32(1);
      if (D.q_lora_rank > 0) {
        r.mla_q_lat = b16(D.q_lora_rank);
        r.mla_q_mean = f32(1);
        r.mla_q_rstd = f32(1);
      }
    }
  };
  auto share_mla_up_buffers = [&](Record& to, const Record& from) {
    to.q = from.q;
    to.k = from.k;
    to.v = from.v;
    if (D.qk_norm) {
      to.mla_kv_lat = from.mla_kv_lat;
      to.mla_kv_mean = from.mla_kv_mean;
      to.mla_kv_rstd = from.mla_kv_rstd;
      to.mla_q_lat = from.mla_q_lat;
      to.mla_q_mean = from.mla_q_mean;
      to.mla_q_rstd = from.mla_q_rstd;
    }
  };
  // (mla_up_own false: the shared up projections' outputs, and the rotated k_pe kept instead)
  auto full_record = [&](Record& r, bool dense_mlp, bool moe, bool fp8, bool expert_act_own = true, bool mla_up_own = true) {
    r.xn1 = b16(h);
    r.mean1 = f32(1, rows_l);
    r.rstd1 = f32(1, rows_l);
    if (!D.mla) {  // (multi-latent attention's: below)
      r.q = b16(Hd);
      r.k = b16(KVd);
      r.v = b16(Vd);
    }
    r.o = b16(Od);
    r.stats = f32(D.nh_local);
    if (D.mla) {  // (the latents before their norms; after them where there are norms: mla_up_buffers)
      r.mla_kv_in = r.mla_kv_lat = b16(D.kv_lora_rank);
      if (D.q_lora_rank > 0) r.mla_q_in = r.mla_q_lat = b16(D.q_lora_rank);
      if (mla_up_own) {
        mla_up_buffers(r);
      } else {
        share_mla_up_buffers(r, *mla_record_);
        r.mla_k_pe = b16(D.qk_rope);
      }
    }
    r.x_mid = res(h, rows_l);
    r.xn2 = b16(h);
    r.mean2 = f32(1, rows_l);
    r.rstd2 = f32(1, rows_l);
    mlp_buffers(r, dense_mlp, moe, fp8, expert_act_own);
    if (fp8) {
      r.f8_amax = static_cast<float*>(alloc(8 * sizeof(float)));
      const int64_t widths[4] = {h, Od, h, F};  // the sites' inputs: QKV, projection, fc1, fc2
      const int sites = dense_mlp ? 4 : 2;  // (an MoE layer's MLP: its experts' own, below)
      for (int site = 0; D.fp8_wgrad && site < sites; ++site) {  // (--no-fp8-wgrad: the weight gradients read x in bf16)
        act_bytes_ += bytes(widths[site], 1, 1.0);
        r.f8_xt[site] = static_cast<uint8_t*>(alloc(bytes(widths[site], 1, 1.0)));
        if (D.fp8_blockwise) {  // (4 bytes per 128 tokens of a feature)
          act_bytes_ += static_cast<size_t>(cuda::fp8_vec128_scales(widths[site], t)) * 4;
          r.f8_xt_scale[site] = block_scales(cuda::fp8_vec128_scales(widths[site], t));
        }
      }
      r.f8_xinv = static_cast<float*>(alloc(4 * 64 * sizeof(float)));
    }
    if (moe && fp8) {  // the FP8 experts' x^T and inverse scales (gpt_cuda_moe_fp8.cpp; under EP the routed experts' grow
                       // with the rows that arrive: Record::ep_f8_xt)
      const int64_t widths[2] = {h, F_moe_}, shared[2] = {h, F_shared_}, blocks = moe_rows_ / cuda::kFp8BlockSize + experts_ + 1;
      for (int site = 0; site < 2; ++site) {
        if (D.ep == 1) r.ex_f8_xt[site] = u8_rows(widths[site], moe_rows_);
        if (F_shared_ > 0) r.sh_f8_xt[site] = u8_rows(shared[site], T);
        if (D.fp8_blockwise) {
          if (D.ep == 1) r.ex_f8_xt_scale[site] = block_scales((widths[site] + 3) / 4 * 4 * blocks);
          if (F_shared_ > 0) r.sh_f8_xt_scale[site] = block_scales(cuda::fp8_vec128_scales(shared[site], T));
        }
      }
      r.ex_f8_xinv = static_cast<float*>(alloc(static_cast<size_t>((experts_ + 1) * 2 * 64) * sizeof(float)));
    }
    if (D.qk_norm && !D.mla) {
      r.q_pre = b16(Hd);
      r.k_pre = b16(KVd);
      r.qn_mean = f32(D.nh_local);
      r.qn_rstd = f32(D.nh_local);
      r.kn_mean = f32(D.ng_local);
      r.kn_rstd = f32(D.ng_local);
    }
  };
  // The activations (records and scratch). With TP they are carved from one symmetric window of the TP
  // group, the same offsets on every rank, so that NCCL runs every TP collective on them (all-reduces,
  // SP's gathers and scatters, the loss statistics) with its symmetric kernels: a first pass only counts
  // the bytes, the second carves them. Without windows: ordinary allocations. Every size here must be the
  // same on every TP rank and in both passes (nothing a rank decides alone, such as cuBLASLt's answers: the
  // bias-gradient scratch is allocated after the arena); alloc_window checks that the totals agree.
  // The split layers under SP (if they split: decided below) sum with an all-to-all into s.parts, in the arena;
  // the buffer only where they may split (the conditions every rank shares, so both passes allocate alike).
  const char* a2a_env = std::getenv("MEGATRAIN_TP_SP_ALLTOALL");
  const char* split_env0 = std::getenv("MEGATRAIN_TP_SPLIT_FORWARD");
  const bool may_split = max_in_flight == 1 && pre_ && post_ && *cfg.training.micro_batch_size % (2 * tp_size_) == 0 && !needs_whole_microbatches() &&
                         std::find(recompute_layer_.begin(), recompute_layer_.end(), true) == recompute_layer_.end() && !mlp_recompute_ &&
                         !(split_env0 && std::string(split_env0) == "0");
  const bool sp_all_to_all = sp_ && may_split && !(a2a_env && std::string(a2a_env) == "0");
  if (sp_) agree_over_tp(sp_all_to_all, "MEGATRAIN_TP_SP_ALLTOALL");
  // The MLP block's buffers of `from` in `to` (what mlp_buffers allocates; under EP the rows that arrive stay in each
  // record's own growing buffers).
  auto share_mlp_buffers = [](Record& to, const Record& from) {
    to.fc1 = from.fc1;
    to.act = from.act;
    to.logits = from.logits;
    to.route_weight = from.route_weight;
    to.top = from.top;
    to.row = from.row;
    to.ex_rows = from.ex_rows;
    to.ex_fc1 = from.ex_fc1;
    to.ex_act = from.ex_act;
    to.ex_out = from.ex_out;
    to.pad_map = from.pad_map;
    to.sh_fc1 = from.sh_fc1;
    to.sh_act = from.sh_act;
    to.sh_out = from.sh_out;
    to.sh_gate = from.sh_gate;
    to.aux_dscale = from.aux_dscale;
  };
  // A layer's record (its input; the rest unless the whole layer is recomputed, with the MLP block's buffers shared
  // where that block is recomputed).
  auto layer_record = [&](int64_t l) {
    auto r = std::make_unique<Record>();
    r->x_in = res(h, rows_l);
    const auto k = static_cast<size_t>(l);
    if (recompute_layer_[k]) return r;
    const bool moe = layers_[k].moe;
    if (!mlp_recompute_layer_[k]) {
      full_record(*r, !moe, moe, fp8_layer(l), !expert_act_shared(l), !mla_up_recompute_);
      return r;
    }
    full_record(*r, false, false, false, true, !mla_up_recompute_);
    share_mlp_buffers(*r, *mlp_record_);
    return r;
  };
  auto allocate_activations = [&]() {
    expert_act_shared_ = nullptr;  // (each pass allocates its own: the arena's counting pass, then the carving one)
    if (mlp_recompute_) {
      bool dense = false, moe = false;
      for (int64_t l = 0; l < L_; ++l) {
        const auto k = static_cast<size_t>(l);
        dense = dense || (mlp_recompute_layer_[k] && !layers_[k].moe);
        moe = moe || (mlp_recompute_layer_[k] && layers_[k].moe);
      }
      mlp_record_ = std::make_unique<Record>();
      mlp_buffers(*mlp_record_, dense, moe, false, true);
    }
    if (mla_up_recompute_) {
      mla_record_ = std::make_unique<Record>();
      mla_up_buffers(*mla_record_);
    }
    for (int64_t l = 0; l < L_; ++l) records_.push_back(layer_record(l));
    if (full_recompute_) {
      recompute_record_ = std::make_unique<Record>();
      bool fp8_recomputed = false;
      for (int64_t l = 0; l < L_; ++l) fp8_recomputed = fp8_recomputed || (recompute_layer_[static_cast<size_t>(l)] && fp8_layer(l));
      full_record(*recompute_record_, moe_layers_ < L_, moe_layers_ > 0, fp8_recomputed);
    }
    // The other slots' records and output-layer activations (slot 0's are records_ and the scratch's).
    slots_.clear();
    slots_.resize(static_cast<size_t>(max_in_flight));
    for (size_t k = 1; k < slots_.size(); ++k) {
      for (int64_t l = 0; l < L_; ++l) slots_[k].records.push_back(layer_record(l));
      if (post_) {  // what the output layer's backward reads
        slots_[k].x_final = res(h, rows_l);
        slots_[k].xnf = b16(h);
        slots_[k].meanf = f32(1, rows_l);
        slots_[k].rstdf = f32(1, rows_l);
      }
    }
    s_ = std::make_unique<Scratch>();
    Scratch& s = *s_;
    if (!D.mla) s.qkv = b16(Wq);
    if (kv_group_) s.q_all = b16(D.qh_local * D.d);
    s.delta = b16(h);
    s.x_final = res(h, rows_l);
    s.xnf = b16(h);
    s.meanf = f32(1, rows_l);
    s.rstdf = f32(1, rows_l);
    if (post_) s.logits = b16_rows(D.V_local, loss_chunk_rows_);  // one chunk's (output_layer())
    s.losses = f32(1);
    s.dres = f32(h, rows_l);
    s.dres16 = b16(h, rows_l);
    s.dxn = b16(h);
    s.d_o = b16(Od);
    s.dq = b16(Hd);
    s.dk = b16(KVd);
    s.dv = b16(Vd);
    if (D.mla) {
      s.mla_kv = b16(D.nh_local * (D.qk_nope + D.v_dim));
      s.mla_k_pe = b16(D.qk_rope);
      s.mla_dlat = b16(mla_rank);
      if (D.qk_norm) {
        s.mla_dlat_in = b16(mla_rank);
        s.mla_tmp = f32(mla_rank);
      }
    }
    if (D.swiglu || D.squared_relu || D.gelu_erf) s.dact = b16(F);  // (the activation's gradient, apart from the GEMM)
    s.dfc1 = b16(F1);
    if (D.fp8) {  // (FP8 runs GELU's backward apart from the data-gradient GEMM, into dact)
      if (!D.swiglu && !D.squared_relu && !D.gelu_erf) s.dact = b16(F);
      const auto widest = static_cast<size_t>(std::max({h, Hd, Od, F, Wq, F1}));
      s.f8_row = static_cast<uint8_t*>(alloc(t * widest));
      s.f8_dyt = static_cast<uint8_t*>(alloc(t * static_cast<size_t>(std::max({Wq, h, F1}))));
      s.f8_scalars = static_cast<float*>(alloc(5 * 64 * sizeof(float)));
      if (D.fp8_blockwise) {
        s.f8_row_scale = block_scales(cuda::fp8_vec128_scales(t, static_cast<int64_t>(widest)));
        s.f8_dyt_scale = block_scales(cuda::fp8_vec128_scales(std::max({Wq, h, F1}), t));
      }
    }
    if (moe_layers_ > 0) {
      const double k = static_cast<double>(topk_);
      const int64_t Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
      s.ex_dout = b16_rows(h, moe_rows_);
      if (!moe_rows_travel()) {
        s.ex_dact = b16_rows(Fm, moe_rows_);
        s.ex_dfc1 = b16_rows(F1m, moe_rows_);
      }
      if (D.ep > 1) s.ep_counts = static_cast<int32_t*>(alloc(static_cast<size_t>(2 * experts_) * 4));
      if (moe_etp_gathers_) s.etp_counts = static_cast<int32_t*>(alloc(static_cast<size_t>((D.etp + 1) * D.experts_local) * 4));
      s.ex_din = b16_rows(h, moe_rows_);
      if (D.fp8) {  // the FP8 experts' scratch (gpt_cuda_moe_fp8.cpp): every routed expert's share, or the shared expert's
        // (under EP the routed experts' grow with the rows that arrive, Scratch::ep_f8_row: here the shared expert's only)
        const int64_t rows = D.ep > 1 ? T : std::max(moe_rows_, T), width = f8_moe_width_;
        s.ex_f8_row = u8_rows(width, rows);
        s.ex_f8_dyt = u8_rows(width, rows);
        s.ex_f8_scalars = static_cast<float*>(alloc(static_cast<size_t>((experts_ + 1) * 3 * 64) * sizeof(float)));
        if (D.fp8_blockwise) {
          s.ex_f8_row_scale = block_scales((width + cuda::kFp8BlockSize - 1) / cuda::kFp8BlockSize * rows);
          s.ex_f8_dyt_scale = block_scales((width + 3) / 4 * 4 * (rows / cuda::kFp8BlockSize + experts_ + 1));
        }
      }
      if (F_shared_ > 0) {
        if (D.swiglu || D.squared_relu || D.gelu_erf || D.fp8) s.sh_dact = b16(F_shared_);
        s.sh_dfc1 = b16(D.swiglu ? 2 * F_shared_ : F_shared_);
        if (shared_gate_) {
          s.sh_dgated = b16(h);
          s.sh_dlogit = f32(1);
        }
      }
      s.dlogits = f32(experts_);
      s.dweight = f32(1, k);
      s.scores = f32(experts_);
      if (moe_sinkhorn_) s.sinkhorn = f32(2 * experts_ + 1);
      if (!quantile_bias_offsets_.empty()) s.quantile_shifted = f32(experts_);
      if (moe_jitter_eps_ > 0) s.router_input = b16(h);
      s.zsum = static_cast<float*>(alloc(static_cast<size_t>(T + 1) * 4));  // the sum, then each token's lse^2
      s.probsum = static_cast<float*>(alloc(static_cast<size_t>(balance_groups * experts_) * 4));
      s.wgrad_parts = static_cast<float*>(alloc(static_cast<size_t>(cuda::moe_router_wgrad_scratch({T, experts_, topk_, h})) * 4));
      s.counts = static_cast<int32_t*>(alloc(static_cast<size_t>(experts_) * 4));
      s.counts_aux = static_cast<float*>(alloc(static_cast<size_t>(balance_groups * experts_) * 4));
      if (moe_seq_aux_ && (moe_aux_coeffs_[0] > 0 || moe_aux_coeffs_[2] > 0)) {
        s.counts_aux_batch = static_cast<float*>(alloc(static_cast<size_t>(experts_) * 4));
        s.probsum_batch = static_cast<float*>(alloc(static_cast<size_t>(experts_) * 4));
      }
      s.offsets = static_cast<int32_t*>(alloc(static_cast<size_t>(experts_ + 1) * 4));
      s.permute_parts = static_cast<int32_t*>(alloc(static_cast<size_t>(cuda::moe_permute_scratch({T, experts_, topk_, h})) * 4));
      if (arena_mode_ != ArenaMode::kCount) {  // (not in the arena's counting pass, which is thrown away)
        void* pinned = nullptr;
        MT_CUDA_CHECK(cudaMallocHost(&pinned, static_cast<size_t>(2 * experts_) * 4));  // (EP: the counts sent, then received)
        s.counts_host = static_cast<int32_t*>(pinned);
        if (moe_etp_gathers_) {  // (expert-TP: this rank's counts per local expert, then every rank's)
          MT_CUDA_CHECK(cudaMallocHost(&pinned, static_cast<size_t>((D.etp + 1) * D.experts_local) * 4));
          s.etp_counts_host = static_cast<int32_t*>(pinned);
        }
      }
    }
    if (D.sink != ModelDims::Sink::kNone) {
      s.sink32 = static_cast<float*>(alloc(static_cast<size_t>(D.nh_local) * 4));
      MT_CUDA_CHECK(cudaMemset(s.sink32, 0, static_cast<size_t>(D.nh_local) * 4));  // (off-by-one: these zeros throughout)
    }
    if (D.qk_norm && !D.mla) {
      s.dq_pre = b16(Hd);
      s.dk_pre = b16(KVd);
      s.qk_tmp = f32(Hd);
    }
    bgrad_len_ = (std::max({Wq, F1, h}) + 7) / 8 * 8;  // the second stream's part 32-byte aligned too
    // Bias gradients from the weight-gradient GEMMs' epilogue where cuBLASLt has one for every such shape
    // (else the bias-gradient kernel).
    auto fusable = [&](int64_t n, int64_t x_width) { return bias_grad_fusable(n, x_width, T); };
    bgrad_epilogue_ = D.bias && (D.mla || fusable(Wq, h)) && fusable(F1, h) && fusable(h, F) && fusable(h, Od);  // (MLA: no QKV bias)
    if (tp_ && post_) s.ce_stats = static_cast<float*>(alloc(static_cast<size_t>(4 * loss_chunk_rows_) * 4));
    if (sp_) {
      s.delta_l = b16(h, rows_l);
      s.xn_l = b16(h, rows_l);
      s.dxn_l = b16(h, rows_l);
      s.dres16_full = b16(h);
      if (sp_all_to_all) s.parts = b16(h);
    }
    if (sp_ || res16_ || !post_) s.emb = f32(h);  // (!post_: the output gradient's dropout in the backward)
    if (D.cp > 1 && D.cp_a2a) {
      for (bf16** b : {&s.a2a_q, &s.a2a_o, &s.a2a_do, &s.a2a_dq, &s.a2a_send, &s.a2a_recv}) *b = b16(Hd);
      for (bf16** b : {&s.a2a_k, &s.a2a_v, &s.a2a_dk, &s.a2a_dv}) *b = b16(KVd);
      if (doc_mask_) {  // every rank's document starts, then in the sequence's order [B S]
        s.doc_starts_all = static_cast<int32_t*>(alloc(static_cast<size_t>(D.cp) * t * 4));
        s.doc_starts = static_cast<int32_t*>(alloc(static_cast<size_t>(D.cp) * t * 4));
      }
    } else if (D.cp > 1) {
      s.ring_acc = f32(Hd);
      s.ring_dq = f32(Hd);
      for (int i = 0; i < 2; ++i) {
        s.ring_kv[i] = b16(2 * KVd);
        s.ring_dkv[i] = f32(2 * KVd);
      }
      s.ring_out = b16(Hd);
      s.ring_dq16 = b16(Hd);
      s.ring_dk16 = b16(KVd);
      s.ring_dv16 = b16(KVd);
      s.ring_lse = f32(D.nh_local);
      if (doc_mask_) s.ring_bias = b16_rows(S_local_, T);
    }
  };
  if (tp_) {
    const size_t before = act_bytes_;
    arena_mode_ = ArenaMode::kCount;
    arena_used_ = 0;
    allocate_activations();
    records_.clear();
    recompute_record_.reset();
    mlp_record_.reset();
    mla_record_.reset();
    slots_.clear();
    s_.reset();
    act_bytes_ = before;
    arena_size_ = arena_used_;
    arena_used_ = 0;
    arena_ = static_cast<char*>(tp_->alloc_window(arena_size_));  // nullptr: no windows
    arena_mode_ = arena_ ? ArenaMode::kCarve : ArenaMode::kOff;
  }
  allocate_activations();
  if (arena_mode_ == ArenaMode::kCarve && arena_used_ != arena_size_) throw std::logic_error("CudaGPT: the activation arena's passes differ");
  arena_mode_ = ArenaMode::kOff;  // later allocations are ordinary
  Scratch& s = *s_;
  // Only this rank's kernels touch it (its size follows this rank's cuBLASLt answer): outside the arena.
  if (bgrad_epilogue_) s.bgrad = static_cast<float*>(alloc(static_cast<size_t>(2 * bgrad_len_) * 4));
  if (D.fp8) allocate_fp8_weights();
  if (D.fp8_delayed) init_fp8_scaling(dp);

  const int64_t mbs = *cfg.training.micro_batch_size;
  check_attention(mbs);
  choose_split_layers(mbs, max_in_flight);
  choose_overwritten_gradients(cfg.derived.world_size);
  if (!post_) {  // unit weights for the kernel that sums the stage's output (see forward)
    const std::vector<float> ones(static_cast<size_t>(h), 1.0f);
    float* tmp = static_cast<float*>(alloc(static_cast<size_t>(h) * 4));
    MT_CUDA_CHECK(cudaMemcpy(tmp, ones.data(), static_cast<size_t>(h) * 4, cudaMemcpyHostToDevice));
    unit_w_ = static_cast<bf16*>(alloc(static_cast<size_t>(h) * 2));
    cuda::cast_to_bf16(unit_w_, tmp, h, stream_, dt_);
  }
  // The RoPE table went up on the legacy stream, which the (non-blocking) training stream does not wait for.
  MT_CUDA_CHECK(cudaDeviceSynchronize());
}

size_t CudaGPT::boundary_activation_bytes(int64_t tokens) const { return static_cast<size_t>(local_rows(tokens) * D_.h) * (res16_ ? 2 : 4); }
size_t CudaGPT::boundary_gradient_bytes(int64_t tokens) const { return static_cast<size_t>(local_rows(tokens) * D_.h) * 4; }

CudaGPT::~CudaGPT() {
  for (void* p : owned_) device_free(p);
  if (s_ && s_->counts_host) cudaFreeHost(s_->counts_host);
  if (s_ && s_->etp_counts_host) cudaFreeHost(s_->etp_counts_host);
  if (fork_ev_) cudaEventDestroy(fork_ev_);
  if (join_ev_) cudaEventDestroy(join_ev_);
  if (proj_done_ev_) cudaEventDestroy(proj_done_ev_);
  for (int i = 0; i < 2; ++i) {
    if (ready_ev_[i]) cudaEventDestroy(ready_ev_[i]);
    if (reduced_ev_[i]) cudaEventDestroy(reduced_ev_[i]);
  }
  if (tp_done_ev_) cudaEventDestroy(tp_done_ev_);
  if (tp_stream_) cudaStreamDestroy(tp_stream_);
  if (wgrad_stream_) {
    cuda::GemmLt::instance().release_workspace(wgrad_stream_);
    cudaStreamDestroy(wgrad_stream_);
  }
  if (cp_ready_ev_) cudaEventDestroy(cp_ready_ev_);
  if (cp_done_ev_) cudaEventDestroy(cp_done_ev_);
  if (cp_stream_) cudaStreamDestroy(cp_stream_);
  for (cudaEvent_t e : expert_done_ev_) cudaEventDestroy(e);
  if (experts_fork_ev_) cudaEventDestroy(experts_fork_ev_);
  for (cudaStream_t st : expert_streams_) {
    cuda::GemmLt::instance().release_workspace(st);
    cudaStreamDestroy(st);
  }
}

void CudaGPT::refresh_working() {
  if (!master_) throw std::logic_error("CUDA model: refresh_working without master weights");
  cuda::cast_to_bf16(w16_, master_, numel_, stream_, dt_);
}

bool CudaGPT::recomputed(int64_t l) const { return recompute_layer_[static_cast<size_t>(l)]; }

const float* CudaGPT::sink_logits(const LayerW& lw) {
  if (D_.sink == ModelDims::Sink::kNone) return nullptr;
  if (D_.sink == ModelDims::Sink::kLearnable) MT_PROF("attention.sink_logits", cuda::sink_logits_to_float(s_->sink32, w(lw.sink), D_.nh_local, stream_, dt_));
  return s_->sink32;
}

const bf16* CudaGPT::document_bias(const DeviceMicrobatch& mb) {
  if (!doc_mask_) return nullptr;
  if (mb.row_start == nullptr) throw std::logic_error("CudaGPT: --reset-attention-mask without the microbatch's document starts");
  const int64_t S = mb.S * D_.cp;  // (context parallelism: the all-to-all's attention over the whole sequences)
  if (mb.B > doc_bias_rows_ || S != D_.S) throw std::logic_error("CudaGPT: a microbatch larger than the document bias was sized for");
  if (mb.serial == 0 || mb.serial != *doc_bias_serial_) {
    const int32_t* starts = mb.row_start;
    if (D_.cp > 1) {  // every CP rank's starts, gathered and put in the sequence's order (4-byte values as pairs of 16-bit)
      if (!cp_) throw std::logic_error("CudaGPT: context parallelism without its group (set_context_parallel)");
      const int64_t T = mb.B * mb.S;
      MT_PROF("attention.document_bias", cp_->all_gather_on(mb.row_start, s_->doc_starts_all, T, WireType::kF32, stream_));
      MT_PROF("attention.document_bias", cuda::a2a_sequence_order(reinterpret_cast<bf16*>(s_->doc_starts), reinterpret_cast<const bf16*>(s_->doc_starts_all),
                                                                   {mb.B, mb.S / 2, D_.cp, D_.cp, 2}, false, stream_));
      starts = s_->doc_starts;
    }
    MT_PROF("attention.document_bias", cuda::document_bias(doc_bias_, starts, mb.B, S, stream_, dt_));
    *doc_bias_serial_ = mb.serial;
  }
  return doc_bias_;
}

cuda::SdpaShape CudaGPT::attention_shape(const DeviceMicrobatch& mb) const {
  cuda::SdpaShape sh{mb.B, mb.S, D_.nh_local, D_.ng_local, D_.d, D_.softmax_scale, dt_, doc_mask_};
  if (D_.mla) sh.Dv = D_.v_dim;  // (multi-latent attention: values of their own width)
  sh.sink = D_.sink != ModelDims::Sink::kNone;
  if (mb.attention_seed != 0) sh.dropout = D_.attention_dropout;
  return sh;
}

uint64_t CudaGPT::attention_seed(const DeviceMicrobatch& mb, int64_t l) const {
  if (mb.attention_seed == 0 || D_.attention_dropout <= 0.0f) return 0;
  const uint64_t seed = rng_key(mb.attention_seed, std::to_string(first_layer_ + l) + "/" + std::to_string(D_.tp_rank));
  return seed != 0 ? seed : 1;  // (0 means none)
}

// Hidden dropout at `site` of the micro batch's keys for rows starting at token t0 (null: none, e.g. in
// evaluation, where the micro batch carries no keys). The returned descriptor lives until the next call.
const cuda::RowDropout* CudaGPT::drop(const DeviceMicrobatch& mb, int32_t site, int64_t t0) {
  if (hidden_dropout_ <= 0.0f || !mb.drop_keys) return nullptr;
  drop_ = {hidden_dropout_, mb.drop_keys, static_cast<int32_t>(1 + 2 * D_.L), site, t0, mb.S, D_.cp, cp_ ? cp_->group_rank() : 0};
  return &drop_;
}

}  // namespace mt
