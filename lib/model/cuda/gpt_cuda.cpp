// gpt_cuda.cpp: forward and backward of the decoder on the CUDA kernels. Per layer the forward keeps
// what its backward reads (or only the layer input under full recompute, re-running the layer before its
// backward); the whole microbatch is forward then backward, so one set of buffers serves every microbatch.
// Shapes are this rank's TP shard: T tokens enter every GEMM; Tl (T / TP under sequence parallelism, else
// T) rows live in the residual stream and the norms.
#include "model/cuda/gpt_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/cross_entropy_bf16.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/embedding_bf16.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/qkv_layout.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

using cuda::bf16;

struct CudaGPT::LayerW {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
  int64_t qn_w = -1, qn_b = -1, kn_w = -1, kn_b = -1;  // --qk-layernorm
};

struct CudaGPT::Record {
  void* x_in = nullptr;  // the layer's input (the residual stream: 16-bit, or fp32 with --fp32-residual-connection)
  void* x_mid = nullptr;  // the residual stream after the attention block
  bf16 *xn1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *xn2 = nullptr, *fc1 = nullptr, *act = nullptr;
  float *mean1 = nullptr, *rstd1 = nullptr, *stats = nullptr, *mean2 = nullptr, *rstd2 = nullptr;
  // --qk-layernorm: the query and key heads before their norm, and its statistics per (token, head).
  bf16 *q_pre = nullptr, *k_pre = nullptr;
  float *qn_mean = nullptr, *qn_rstd = nullptr, *kn_mean = nullptr, *kn_rstd = nullptr;
};

// [T, .] unless marked [Tl, .]; the *_l buffers exist under sequence parallelism only.
struct CudaGPT::Scratch {
  bf16 *q_all = nullptr /*[T, qh_local * d]: K/V replication only*/, *qkv = nullptr, *delta = nullptr, *xnf = nullptr, *logits = nullptr, *dres16 = nullptr /*[Tl]*/, *dxn = nullptr;
  bf16 *d_o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dact = nullptr, *dfc1 = nullptr;
  bf16 *delta_l = nullptr, *xn_l = nullptr, *dxn_l = nullptr, *dres16_full = nullptr;
  void* x_final = nullptr;  // [Tl], the residual stream's type
  float *meanf = nullptr, *rstdf = nullptr, *losses = nullptr, *dres = nullptr /*[Tl]*/;
  float *emb = nullptr /*[T, h] fp32: the embedding's sum (SP or a 16-bit residual) and SP's gradient gather*/, *ce_stats = nullptr /*[4T]: vocab-parallel loss*/;
  bf16 *dq_pre = nullptr, *dk_pre = nullptr;  // --qk-layernorm: the heads' gradients before their norm
  float* qk_tmp = nullptr;                     // --qk-layernorm: [T, Hd] fp32 scratch of the norm backward
  float* bgrad = nullptr;  // [2, max(Wq, F1, h)], models with biases: a bias gradient from a weight-gradient GEMM's epilogue, per stream
  float* norm_part = nullptr;  // the split TP backward: its norms' weight-gradient partial sums (on tp_stream_)
  int32_t* half_pos = nullptr;  // the split layers under SP: the positions in half-major row order [T]
  bf16* parts = nullptr;  // the split layers under SP: each half's all-to-all of the ranks' partial sums of this rank's piece [T, h]
};

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
                 bool keep_master, StreamCollectives* dp)
    : D_(model_dims(cfg, tp ? tp->group_rank() : 0, tp ? tp->group_size() : 1)),
      stream_(stream),
      dt_(cfg.precision.fp16 ? cuda::F16::kFP16 : cuda::F16::kBF16),
      ab_(cfg.precision.fp16 ? CUDA_R_16F : CUDA_R_16BF),
      wire_(cfg.precision.fp16 ? WireType::kF16 : WireType::kBF16),
      res16_(!cfg.precision.fp32_residual_connection),
      hidden_dropout_(static_cast<float>(cfg.model.hidden_dropout)) {
  const ModelDims& D = D_;
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
  // must start on a multiple of 8 elements (true when hidden, FFN and vocabulary sizes are multiples of 8).
  for (const auto& p : layout.infos()) {
    if (p.offset % 8 != 0) {
      throw std::runtime_error("the CUDA engine needs every parameter to start on a multiple of 8 elements; " + p.name +
                               " does not (make --hidden-size, --ffn-hidden-size and the padded vocabulary multiples of 8 per tensor-parallel rank), or use --device cpu");
    }
  }
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

  if (!where.pre_process || !where.post_process || static_cast<int64_t>(where.layers.size()) != D.L) {
    throw std::logic_error("CudaGPT: the CUDA engine runs the whole model on one stage");
  }
  // Flat offsets of the layout's parameters (-1: the model has none).
  auto offset = [&](size_t i) { return i == kNoParam ? int64_t{-1} : layout.info(i).offset; };
  wte_ = offset(where.word_embeddings);
  wpe_ = offset(where.position_embeddings);
  lnf_w_ = offset(where.final_norm_w);
  lnf_b_ = offset(where.final_norm_b);
  out_w_ = offset(where.output_w);
  layers_.resize(static_cast<size_t>(D.L));
  layer_replicated_.resize(static_cast<size_t>(D.L));
  for (int64_t l = 0; l < D.L; ++l) {
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
    for (size_t i = ly.first; i < ly.end; ++i) {
      if (layout.info(i).tp_replicated()) layer_replicated_[static_cast<size_t>(l)].emplace_back(layout.info(i).offset, layout.info(i).numel);
    }
    layer_start_.push_back(layout.info(ly.first).offset);
    layer_end_.push_back(layout.info(ly.end - 1).offset + layout.info(ly.end - 1).numel);
  }
  embed_end_ = layout.info(where.embedding_end - 1).offset + layout.info(where.embedding_end - 1).numel;
  for (size_t i : {where.final_norm_w, where.final_norm_b}) {
    if (i != kNoParam) final_replicated_.emplace_back(layout.info(i).offset, layout.info(i).numel);
  }
  if (D.rope) {
    const auto table = cuda::rope_table(D.max_pos, D.rot_dim, static_cast<double>(D.rope_base));
    rope_table_ = static_cast<float*>(alloc(table.size() * 4));
    MT_CUDA_CHECK(cudaMemcpy(rope_table_, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  }

  // Recompute: full granularity re-runs whole layers (uniform: every layer from its own input; block: the
  // first --recompute-num-layers layers). Selective keeps nothing extra to drop: flash attention never
  // stores the S x S probabilities and recomputes them in its backward already.
  const auto& rc = cfg.recompute;
  full_recompute_ = rc.recompute_granularity && *rc.recompute_granularity == "full";
  recompute_layer_.assign(static_cast<size_t>(D.L), false);
  if (full_recompute_) {
    const bool block = rc.recompute_method && *rc.recompute_method == "block";
    const int64_t n = rc.recompute_num_layers.value_or(1);
    for (int64_t l = 0; l < D.L; ++l) recompute_layer_[static_cast<size_t>(l)] = block ? l < n : true;
  }

  if (!D.swiglu && D.F_local % 8 != 0) {
    throw std::runtime_error("the CUDA engine fuses GELU into the fc1 GEMM, which needs --ffn-hidden-size / TP to be a multiple of 8 (this model: " +
                             std::to_string(D.F_local) + "): change --ffn-hidden-size, or use --device cpu");
  }
  const int64_t T = *cfg.training.micro_batch_size * D.S;
  if (sp_ && T % tp_size_ != 0) {
    throw std::runtime_error("sequence parallelism needs --micro-batch-size x --seq-length divisible by --tensor-model-parallel-size");
  }
  T_max_ = T;
  const double rows_l = sp_ ? 1.0 / static_cast<double>(tp_size_) : 1.0;  // Tl / T
  W_ = {D.nh_local * D.d, D.ng_local * D.d, (D.qh_local + 2 * D.ng_local) * D.d, D.F_local, D.swiglu ? 2 * D.F_local : D.F_local};
  const int64_t h = D.h, Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  const size_t t = static_cast<size_t>(T);
  auto bytes = [&](int64_t n, size_t elem, double rows) { return static_cast<size_t>(static_cast<double>(t) * rows) * static_cast<size_t>(n) * elem; };
  auto b16 = [&](int64_t n, double rows = 1.0) {
    act_bytes_ += bytes(n, 2, rows);
    return static_cast<bf16*>(alloc(bytes(n, 2, rows)));
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
  auto full_record = [&](Record& r) {
    r.xn1 = b16(h);
    r.mean1 = f32(1, rows_l);
    r.rstd1 = f32(1, rows_l);
    r.q = b16(Hd);
    r.k = b16(KVd);
    r.v = b16(KVd);
    r.o = b16(Hd);
    r.stats = f32(D.nh_local);
    r.x_mid = res(h, rows_l);
    r.xn2 = b16(h);
    r.mean2 = f32(1, rows_l);
    r.rstd2 = f32(1, rows_l);
    r.fc1 = b16(F1);
    r.act = b16(F);
    if (D.qk_norm) {
      r.q_pre = b16(Hd);
      r.k_pre = b16(KVd);
      r.qn_mean = f32(D.nh_local);
      r.qn_rstd = f32(D.nh_local);
      r.kn_mean = f32(D.ng_local);
      r.kn_rstd = f32(D.ng_local);
    }
  };
  auto& lt = cuda::GemmLt::instance();
  auto fusable_k = [&](int64_t n, int64_t x_width, int64_t k) {
    return lt.has_algorithm(true, false, n, x_width, k, n, x_width, x_width, ab_, CUDA_R_32F, {cuda::GemmEpilogue::kBiasGrad, nullptr, 0});
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
  const bool may_split = *cfg.training.micro_batch_size % (2 * tp_size_) == 0 && !kv_group_ && !D.qk_norm &&
                         std::find(recompute_layer_.begin(), recompute_layer_.end(), true) == recompute_layer_.end() &&
                         !(split_env0 && std::string(split_env0) == "0");
  const bool sp_all_to_all = sp_ && may_split && !(a2a_env && std::string(a2a_env) == "0");
  if (sp_) agree_over_tp(sp_all_to_all, "MEGATRAIN_TP_SP_ALLTOALL");
  auto allocate_activations = [&]() {
    for (int64_t l = 0; l < D.L; ++l) {
      auto r = std::make_unique<Record>();
      r->x_in = res(h, rows_l);
      if (!recompute_layer_[static_cast<size_t>(l)]) full_record(*r);
      records_.push_back(std::move(r));
    }
    if (full_recompute_) {
      recompute_record_ = std::make_unique<Record>();
      full_record(*recompute_record_);
    }
    s_ = std::make_unique<Scratch>();
    Scratch& s = *s_;
    s.qkv = b16(Wq);
    if (kv_group_) s.q_all = b16(D.qh_local * D.d);
    s.delta = b16(h);
    s.x_final = res(h, rows_l);
    s.xnf = b16(h);
    s.meanf = f32(1, rows_l);
    s.rstdf = f32(1, rows_l);
    s.logits = b16(D.V_local);
    s.losses = f32(1);
    s.dres = f32(h, rows_l);
    s.dres16 = b16(h, rows_l);
    s.dxn = b16(h);
    s.d_o = b16(Hd);
    s.dq = b16(Hd);
    s.dk = b16(KVd);
    s.dv = b16(KVd);
    if (D.swiglu) s.dact = b16(F);
    s.dfc1 = b16(F1);
    if (D.qk_norm) {
      s.dq_pre = b16(Hd);
      s.dk_pre = b16(KVd);
      s.qk_tmp = f32(Hd);
    }
    bgrad_len_ = (std::max({Wq, F1, h}) + 7) / 8 * 8;  // the second stream's part 32-byte aligned too
    // Bias gradients from the weight-gradient GEMMs' epilogue where cuBLASLt has one for every such shape
    // (else the bias-gradient kernel).
    auto fusable = [&](int64_t n, int64_t x_width) { return fusable_k(n, x_width, T); };
    bgrad_epilogue_ = D.bias && fusable(Wq, h) && fusable(F1, h) && fusable(h, F) && fusable(h, W_.Hd);
    if (tp_) s.ce_stats = f32(4);
    if (sp_) {
      s.delta_l = b16(h, rows_l);
      s.xn_l = b16(h, rows_l);
      s.dxn_l = b16(h, rows_l);
      s.dres16_full = b16(h);
      if (sp_all_to_all) s.parts = b16(h);
    }
    if (sp_ || res16_) s.emb = f32(h);
  };
  if (tp_) {
    const size_t before = act_bytes_;
    arena_mode_ = ArenaMode::kCount;
    arena_used_ = 0;
    allocate_activations();
    records_.clear();
    recompute_record_.reset();
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

  // Fail here, with the shape named, rather than in the first step.
  const int64_t mbs = *cfg.training.micro_batch_size;
  const std::string why = cuda::CudnnSdpa::instance().check({mbs, D.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_});
  if (!why.empty()) throw std::runtime_error(why);
  // The split forward and backward (MEGATRAIN_TP_SPLIT_FORWARD=0 turns both off): TP without K/V
  // replication, an even micro batch (under SP a multiple of 2 TP, so that every rank's piece of a half is
  // whole sequences, and no recomputed layer: the recompute runs the plain forward, in the natural row order),
  // cuDNN attention for half of it and, with the bias-gradient epilogue, that epilogue for half of the rows.
  // Each half's rows (and under SP each piece's) start 256-byte aligned in every [rows, width] buffer
  // (cuBLASLt's plans assume it).
  const int64_t half_rows = mbs / 2 * D.S;
  bool aligned = true;
  for (int64_t width : {h, Wq, W_.Hd, W_.KVd, F, F1}) aligned = aligned && (half_rows * width * 2) % 256 == 0;
  aligned = aligned && (piece(half_rows) * h * 2) % 256 == 0;
  const bool any_recompute = std::find(recompute_layer_.begin(), recompute_layer_.end(), true) != recompute_layer_.end();
  const bool sp_ok = !sp_ || (mbs % (2 * tp_size_) == 0 && !any_recompute);
  const char* split_env = std::getenv("MEGATRAIN_TP_SPLIT_FORWARD");
  if (kv_group_ && D.qk_norm) {
    throw std::runtime_error("--qk-layernorm with K/V replicated over TP (fewer query groups than TP) is not implemented on the CUDA engine");
  }
  split_forward_ = tp_ && sp_ok && !kv_group_ && !D.qk_norm && mbs % 2 == 0 && aligned && !(split_env && std::string(split_env) == "0") &&
                   cuda::CudnnSdpa::instance().check({mbs / 2, D.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_}).empty();
  if (split_forward_ && bgrad_epilogue_) {
    // (Under SP the row-parallel biases' gradients come from this rank's rows, not from the epilogue.)
    split_forward_ = fusable_k(Wq, h, half_rows) && fusable_k(F1, h, half_rows) &&
                     (sp_ || (fusable_k(h, F, half_rows) && fusable_k(h, W_.Hd, half_rows)));
  }
  if (tp_) agree_over_tp(split_forward_, "MEGATRAIN_TP_SPLIT_FORWARD");
  all_to_all_ = split_forward_ && s.parts != nullptr;
  if (split_forward_) {
    int least = 0, greatest = 0;  // the reductions go first when SMs free up
    MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MT_CUDA_CHECK(cudaStreamCreateWithPriority(&tp_stream_, cudaStreamNonBlocking, greatest));
    for (int i = 0; i < 2; ++i) {
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_ev_[i], cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_ev_[i], cudaEventDisableTiming));
    }
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&tp_done_ev_, cudaEventDisableTiming));
    // The split backward's norms run on tp_stream_, away from the caching allocator (compute stream only).
    const auto part_bytes = static_cast<size_t>(cuda::norm_backward_partials(h)) * 4;
    s.norm_part = static_cast<float*>(alloc(part_bytes));
    act_bytes_ += part_bytes;
    if (sp_) s.half_pos = static_cast<int32_t*>(alloc(static_cast<size_t>(T) * 4));
  }
  // The RoPE table went up on the legacy stream, which the (non-blocking) training stream does not wait for.
  MT_CUDA_CHECK(cudaDeviceSynchronize());
}

// The TP ranks must issue the same collectives: a setting that follows each rank's environment must agree.
void CudaGPT::agree_over_tp(bool mine, const char* env) {
  float* agree = static_cast<float*>(alloc(4));
  const float one = mine ? 1.0f : 0.0f;
  MT_CUDA_CHECK(cudaMemcpyAsync(agree, &one, 4, cudaMemcpyHostToDevice, stream_));
  tp_->all_reduce_on(agree, 1, WireType::kF32, ReduceOp::kSum, stream_);
  float sum = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&sum, agree, 4, cudaMemcpyDeviceToHost, stream_));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (sum != 0.0f && sum != static_cast<float>(tp_size_)) {
    throw std::runtime_error(std::string("the tensor-parallel ranks disagree on ") + env + ": set it the same for every rank (mpirun -x)");
  }
}

CudaGPT::~CudaGPT() {
  for (void* p : owned_) cudaFree(p);
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
}

void CudaGPT::refresh_working() {
  if (!master_) throw std::logic_error("CUDA model: refresh_working without master weights");
  cuda::cast_to_bf16(w16_, master_, numel_, stream_, dt_);
}

bool CudaGPT::recomputed(int64_t l) const { return recompute_layer_[static_cast<size_t>(l)]; }

// Hidden dropout at `site` of the micro batch's keys for rows starting at token t0 (null: none, e.g. in
// evaluation, where the micro batch carries no keys). The returned descriptor lives until the next call.
const cuda::RowDropout* CudaGPT::drop(const DeviceMicrobatch& mb, int32_t site, int64_t t0) {
  if (hidden_dropout_ <= 0.0f || !mb.drop_keys) return nullptr;
  drop_ = {hidden_dropout_, mb.drop_keys, static_cast<int32_t>(1 + 2 * D_.L), site, t0, mb.S};
  return &drop_;
}

const bf16* CudaGPT::combine_rows(bf16* full, bf16* local, int64_t T) {
  if (!tp_) return full;
  if (sp_) {
    MT_PROF("tp.reduce_scatter", tp_->reduce_scatter_on(full, local, T / tp_size_ * D_.h, wire_, stream_));
    return local;
  }
  MT_PROF("tp.all_reduce", tp_->all_reduce_on(full, T * D_.h, wire_, ReduceOp::kSum, stream_));
  return full;
}

// K/V replication: this rank's nh_local query heads [T, nh_local, d] and all its group's [T, qh_local, d].
// Forward: own = its slice of group; backward: group = own in its slice, zeros elsewhere.
void CudaGPT::copy_own_heads(bf16* own, bf16* group, int64_t T, bool to_group) {
  const size_t row = static_cast<size_t>(D_.nh_local * D_.d) * 2, all = static_cast<size_t>(D_.qh_local * D_.d) * 2;
  char* slice = reinterpret_cast<char*>(group) + static_cast<size_t>(D_.tp_rank % D_.kv_rep) * row;
  const auto rows = static_cast<size_t>(T);
  if (to_group) {
    MT_CUDA_CHECK(cudaMemsetAsync(group, 0, all * rows, stream_));
    MT_CUDA_CHECK(cudaMemcpy2DAsync(slice, all, own, row, row, rows, cudaMemcpyDeviceToDevice, stream_));
  } else {
    MT_CUDA_CHECK(cudaMemcpy2DAsync(own, row, slice, all, row, rows, cudaMemcpyDeviceToDevice, stream_));
  }
}

// A weight gradient dW[n, h] += dy[T, n]^T x[T, h] on stream ws and, with a bias, its gradient from the GEMM's
// epilogue (the sum over tokens of dy, from the same read) added to the bias's. Nothing here takes
// temporaries from the caching allocator, which assumes the compute stream.
void CudaGPT::wgrad_with_bias(cudaStream_t ws, const char* name, int64_t n, int64_t T, const bf16* dy, const bf16* x, int64_t h, int64_t w_off,
                              int64_t b_off) {
  auto& lt = cuda::GemmLt::instance();
  if (b_off < 0) {
    MT_PROF_ON(ws, name, lt.gemm_ex(true, false, n, h, T, 1.0f, dy, n, x, h, 1.0f, g(w_off), h, ab_, CUDA_R_32F, nullptr, ws));
    return;
  }
  float* tmp = ws == stream_ ? s_->bgrad : s_->bgrad + bgrad_len_;  // one per stream: the two may run at once
  MT_PROF_ON(ws, name, lt.gemm_ex(true, false, n, h, T, 1.0f, dy, n, x, h, 1.0f, g(w_off), h, ab_, CUDA_R_32F, nullptr, ws,
                                  {cuda::GemmEpilogue::kBiasGrad, tmp, 0}));
  MT_PROF_ON(ws, "bwd.bias_grad", cuda::add_f32(g(b_off), tmp, n, ws));
}

cudaStream_t CudaGPT::fork_wgrad() {
  if (!wgrad_stream_) return stream_;
  MT_CUDA_CHECK(cudaEventRecord(fork_ev_, stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(wgrad_stream_, fork_ev_, 0));
  return wgrad_stream_;
}

void CudaGPT::join_wgrad() {
  if (!wgrad_stream_) return;
  MT_CUDA_CHECK(cudaEventRecord(join_ev_, wgrad_stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_ev_, 0));
}

bf16* CudaGPT::gather_rows(bf16* local, bf16* full, int64_t T) {
  if (!sp_) return local;
  MT_PROF("tp.all_gather", tp_->all_gather_on(local, full, T / tp_size_ * D_.h, wire_, stream_));
  return full;
}

bf16* CudaGPT::norm_out(bf16* full) const { return sp_ ? s_->xn_l : full; }

void CudaGPT::sum_replicated_grads(const std::vector<std::pair<int64_t, int64_t>>& params, cudaStream_t st) {
  if (!sp_ || !final_backward_ || params.empty()) return;
  tp_->group_start();
  for (const auto& [off, n] : params) tp_->all_reduce_on(g(off), n, WireType::kF32, ReduceOp::kSum, st);
  MT_PROF_ON(st, "tp.replicated_grads", tp_->group_end());
}

// From r's xn1 (the normalised input, all T rows) to the MLP output of this rank's rows; r.x_mid and the
// rest saved in r.
const bf16* CudaGPT::layer_forward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  const int64_t Hd = W_.Hd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  const cuda::SdpaShape sh{mb.B, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
  MT_PROF("fwd.gemm.qkv", lt.gemm_ex(false, true, T, Wq, h, 1.0f, r.xn1, h, w(lw.qkv_w), h, 0.0f, s.qkv, Wq, ab_, ab_, w(lw.qkv_b), stream_));
  if (D.qk_norm) {  // split, the norm of every query and key head, then RoPE (as Megatron: norm before rotary)
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope(r.q_pre, r.k_pre, r.v, s.qkv, mb.positions, nullptr, T, D.nh_local, D.ng_local, D.d,
                                                       D.rot_dim, stream_, dt_));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward(nullptr, r.q, r.qn_mean, r.qn_rstd, r.q_pre, nullptr, w(lw.qn_w), w(lw.qn_b), T * D.nh_local,
                                                  D.d, D.eps, D.rms, stream_, dt_, true));
    MT_PROF("fwd.qk_norm", cuda::add_norm_forward(nullptr, r.k, r.kn_mean, r.kn_rstd, r.k_pre, nullptr, w(lw.kn_w), w(lw.kn_b), T * D.ng_local,
                                                  D.d, D.eps, D.rms, stream_, dt_, true));
    if (D.rope) {
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.q, mb.positions, rope_table_, T, D.nh_local, D.d, D.rot_dim, 1.0f, stream_, dt_));
      MT_PROF("fwd.rope", cuda::rope_apply_16(r.k, mb.positions, rope_table_, T, D.ng_local, D.d, D.rot_dim, 1.0f, stream_, dt_));
    }
  } else if (!kv_group_) {
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope(r.q, r.k, r.v, s.qkv, mb.positions, D.rope ? rope_table_ : nullptr, T, D.nh_local, D.ng_local,
                                                       D.d, D.rot_dim, stream_, dt_));
  } else {  // the group's query heads, then this rank's nh_local of them
    MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope(s.q_all, r.k, r.v, s.qkv, mb.positions, D.rope ? rope_table_ : nullptr, T, D.qh_local, D.ng_local,
                                                       D.d, D.rot_dim, stream_, dt_));
    MT_PROF("fwd.qkv_split_rope", copy_own_heads(r.q, s.q_all, T, false));
  }
  MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(sh, r.q, r.k, r.v, r.o, r.stats, stream_));
  // Row-parallel: the bias joins one rank's partial sum.
  MT_PROF("fwd.gemm.proj", lt.gemm_ex(false, true, T, h, Hd, 1.0f, r.o, Hd, w(lw.proj_w), Hd, 0.0f, s.delta, h, ab_, ab_, row_bias(lw.proj_b), stream_));
  const bf16* attn = combine_rows(s.delta, s.delta_l, T);
  MT_PROF("fwd.add_norm", cuda::add_norm_forward(r.x_mid, norm_out(r.xn2), r.mean2, r.rstd2, x_in, attn, w(lw.ln2_w), w(lw.ln2_b), Tl, h, D.eps, D.rms,
                                                 stream_, dt_, res16_, drop(mb, attn_site(l), row0(T))));
  gather_rows(s.xn_l, r.xn2, T);
  if (D.swiglu) {
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, T, F1, h, 1.0f, r.xn2, h, w(lw.fc1_w), h, 0.0f, r.fc1, F1, ab_, ab_, w(lw.fc1_b), stream_));
    MT_PROF("fwd.activation", cuda::swiglu_forward_bf16(r.act, r.fc1, T, F, stream_, dt_));
  } else {  // GELU in the GEMM's epilogue, its input kept for the backward
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, T, F, h, 1.0f, r.xn2, h, w(lw.fc1_w), h, 0.0f, r.act, F, ab_, ab_, w(lw.fc1_b), stream_,
                                       {cuda::GemmEpilogue::kGeluAux, r.fc1, F}));
  }
  MT_PROF("fwd.gemm.fc2", lt.gemm_ex(false, true, T, h, F, 1.0f, r.act, F, w(lw.fc2_w), F, 0.0f, s.delta, h, ab_, ab_, row_bias(lw.fc2_b), stream_));
  return combine_rows(s.delta, s.delta_l, T);
}

void CudaGPT::reduce_half(int64_t half, int64_t rows, bf16* base, bf16* local, const SumConsumer& then) {
  MT_CUDA_CHECK(cudaEventRecord(ready_ev_[half], stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(tp_stream_, ready_ev_[half], 0));
  bf16* data = base + half * rows * D_.h;
  const int64_t pr = piece(rows);
  const bf16* sum = data;
  cuda::Partials parts;
  if (all_to_all_ && then) {
    bf16* got = s_->parts + half * rows * D_.h;
    MT_PROF_ON(tp_stream_, "tp.all_to_all", tp_->all_to_all_on(data, got, pr * D_.h, wire_, tp_stream_));
    sum = got;
    parts = {static_cast<int>(tp_size_), pr * D_.h};
  } else if (sp_) {
    bf16* mine = local + half * pr * D_.h;
    MT_PROF_ON(tp_stream_, "tp.reduce_scatter", tp_->reduce_scatter_on(data, mine, pr * D_.h, wire_, tp_stream_));
    sum = mine;
  } else {
    MT_PROF_ON(tp_stream_, "tp.all_reduce", tp_->all_reduce_on(data, rows * D_.h, wire_, ReduceOp::kSum, tp_stream_));
  }
  if (then) then(tp_stream_, sum, parts);
  MT_CUDA_CHECK(cudaEventRecord(reduced_ev_[half], tp_stream_));
}

void CudaGPT::gather_half(int64_t half, int64_t rows, const bf16* local, bf16* full, cudaStream_t st) {
  const int64_t pr = piece(rows);
  MT_PROF_ON(st, "tp.all_gather", tp_->all_gather_on(local + half * pr * D_.h, full + half * rows * D_.h, pr * D_.h, wire_, st));
}

const int32_t* CudaGPT::layer_positions(const DeviceMicrobatch& mb) const { return s_->half_pos ? s_->half_pos : mb.positions; }

void CudaGPT::wait_reduced(int64_t half) { MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, reduced_ev_[half], 0)); }

void CudaGPT::wait_tp_stream() {
  MT_CUDA_CHECK(cudaEventRecord(tp_done_ev_, tp_stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, tp_done_ev_, 0));
}

// Half `half` of layer l's attention block: QKV (from the input norm the previous layer's MLP half queued on
// tp_stream_), attention and the projection, whose all-reduce and the MLP's input norm are left running.
void CudaGPT::attention_half(int64_t l, int64_t half, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t Bh = mb.B / 2, rows = Bh * mb.S, r0 = half * rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq;
  Record& r = recomputed(l) ? *recompute_record_ : *records_[static_cast<size_t>(l)];
  if (l > 0) wait_reduced(half);  // the previous layer's MLP output reduced and this layer's input norm taken
  MT_PROF("fwd.gemm.qkv", lt.gemm_ex(false, true, rows, Wq, h, 1.0f, r.xn1 + r0 * h, h, w(lw.qkv_w), h, 0.0f, s.qkv + r0 * Wq, Wq, ab_, ab_,
                                     w(lw.qkv_b), stream_));
  MT_PROF("fwd.qkv_split_rope", cuda::qkv_split_rope(r.q + r0 * Hd, r.k + r0 * KVd, r.v + r0 * KVd, s.qkv + r0 * Wq, layer_positions(mb) + r0,
                                                     D.rope ? rope_table_ : nullptr, rows, D.nh_local, D.ng_local, D.d, D.rot_dim, stream_, dt_));
  const cuda::SdpaShape sh{Bh, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
  MT_PROF("fwd.attention", cuda::CudnnSdpa::instance().forward(sh, r.q + r0 * Hd, r.k + r0 * KVd, r.v + r0 * KVd, r.o + r0 * Hd,
                                                               r.stats + half * Bh * D.nh_local * mb.S, stream_));
  MT_PROF("fwd.gemm.proj", lt.gemm_ex(false, true, rows, h, Hd, 1.0f, r.o + r0 * Hd, Hd, w(lw.proj_w), Hd, 0.0f, s.delta + r0 * h, h, ab_, ab_,
                                      row_bias(lw.proj_b), stream_));
  // The MLP's input norm of these rows follows the reduction on the TP stream (the other half's work runs
  // on the compute stream meanwhile); under SP on this rank's piece, then gathered.
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  const int64_t pr = piece(rows), p0 = half * pr;
  bf16* xn = sp_ ? s.xn_l : r.xn2;
  reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward(res_at(r.x_mid, p0 * h), xn + p0 * h, r.mean2 + p0, r.rstd2 + p0, res_at(x_in, p0 * h), sum,
                                                          w(lw.ln2_w), w(lw.ln2_b), pr, h, D.eps, D.rms, st, dt_, res16_,
                                                          drop(mb, attn_site(l), row0(mb.B * mb.S) + p0), parts));
    if (sp_) gather_half(half, rows, s.xn_l, r.xn2, st);
  });
}

// Half `half` of layer l's MLP block: fc1 (from the norm queued behind the attention's all-reduce), the
// activation and fc2, whose all-reduce and the next layer's input norm are left running.
void CudaGPT::mlp_half(int64_t l, int64_t half, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t rows = mb.B / 2 * mb.S, r0 = half * rows, h = D.h, F = W_.F, F1 = W_.F1;
  Record& r = recomputed(l) ? *recompute_record_ : *records_[static_cast<size_t>(l)];
  wait_reduced(half);  // the attention output reduced and the MLP's input norm taken
  if (D.swiglu) {
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, rows, F1, h, 1.0f, r.xn2 + r0 * h, h, w(lw.fc1_w), h, 0.0f, r.fc1 + r0 * F1, F1, ab_, ab_,
                                       w(lw.fc1_b), stream_));
    MT_PROF("fwd.activation", cuda::swiglu_forward_bf16(r.act + r0 * F, r.fc1 + r0 * F1, rows, F, stream_, dt_));
  } else {
    MT_PROF("fwd.gemm.fc1", lt.gemm_ex(false, true, rows, F, h, 1.0f, r.xn2 + r0 * h, h, w(lw.fc1_w), h, 0.0f, r.act + r0 * F, F, ab_, ab_,
                                       w(lw.fc1_b), stream_, {cuda::GemmEpilogue::kGeluAux, r.fc1 + r0 * F, F}));
  }
  MT_PROF("fwd.gemm.fc2", lt.gemm_ex(false, true, rows, h, F, 1.0f, r.act + r0 * F, F, w(lw.fc2_w), F, 0.0f, s.delta + r0 * h, h, ab_, ab_,
                                     row_bias(lw.fc2_b), stream_));
  if (l + 1 == D.L) {  // the final norm runs after both halves, on the compute stream
    reduce_half(half, rows, s.delta, s.delta_l, nullptr);
    return;
  }
  // The next layer's input norm of these rows follows the reduction on the TP stream (under SP on this
  // rank's piece, then gathered).
  const LayerW& nw = layers_[static_cast<size_t>(l + 1)];
  Record& n = recomputed(l + 1) ? *recompute_record_ : *records_[static_cast<size_t>(l + 1)];
  const int64_t pr = piece(rows), p0 = half * pr;
  bf16* xn = sp_ ? s.xn_l : n.xn1;
  reduce_half(half, rows, s.delta, s.delta_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "fwd.add_norm", cuda::add_norm_forward(res_at(records_[static_cast<size_t>(l + 1)]->x_in, p0 * h), xn + p0 * h, n.mean1 + p0,
                                                          n.rstd1 + p0, res_at(r.x_mid, p0 * h), sum, w(nw.ln1_w), w(nw.ln1_b), pr, h, D.eps, D.rms, st,
                                                          dt_, res16_, drop(mb, mlp_site(l), row0(mb.B * mb.S) + p0), parts));
    if (sp_) gather_half(half, rows, s.xn_l, n.xn1, st);
  });
}

// Every reduction goes through tp_stream_ in the order issued here, which is the same on every TP rank;
// collectives on the compute stream before (the embedding's) and after (the loss's) are ordered against
// them by the events.
void CudaGPT::split_layers_forward(const DeviceMicrobatch& mb) {
  for (int64_t l = 0; l < D_.L; ++l) {
    attention_half(l, 0, mb);
    attention_half(l, 1, mb);
    // The MLP halves' reductions are followed by the next layer's input norm on the TP stream, which reads
    // that layer's weights: the compute stream waits for them first (the TP stream follows it).
    if (l + 1 < D_.L) need_params(layer_end_[static_cast<size_t>(l + 1)]);
    mlp_half(l, 0, mb);
    mlp_half(l, 1, mb);
  }
  wait_reduced(0);
  wait_reduced(1);
}

// s_->dres holds d(layer output) on entry and d(layer input) on exit (s_->dres16 its bf16 copy), this
// rank's rows.
void CudaGPT::layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h;
  const int64_t Hd = W_.Hd, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  // MLP
  const bf16* dy = gather_rows(s.dres16, s.dres16_full, T);
  if (D.swiglu) {
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, T, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, s.dact, F, ab_, ab_, nullptr, stream_));
  } else {  // the GELU backward in the epilogue: straight to d(fc1 output)
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, T, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, s.dfc1, F, ab_, ab_, nullptr, stream_,
                                             {cuda::GemmEpilogue::kDGelu, r.fc1, F}));
  }
  // Row-parallel biases: under SP their gradient is this rank's rows' (summed over TP later), not all of dy's.
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  wgrad_with_bias(stream_, "bwd.gemm.fc2_wgrad", h, T, dy, r.act, F, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
  if (!fuse_row && lw.fc2_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc2_b), s.dres16, Tl, h, stream_, dt_));
  if (D.swiglu) MT_PROF("bwd.activation", cuda::swiglu_backward_bf16(s.dfc1, s.dact, r.fc1, T, F, stream_, dt_));
  MT_PROF("bwd.gemm.fc1_dgrad", lt.gemm_ex(false, false, T, h, F1, 1.0f, s.dfc1, F1, w(lw.fc1_w), h, 0.0f, s.dxn, h, ab_, ab_, nullptr, stream_));
  // Without the epilogue the bias gradient kernel stays on the compute stream (its temporaries come from the
  // caching allocator, which assumes that stream).
  if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), s.dfc1, T, F1, stream_, dt_));
  cudaStream_t ws = fork_wgrad();
  wgrad_with_bias(ws, "bwd.gemm.fc1_wgrad", F1, T, s.dfc1, r.xn2, h, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
  const bf16* dmlp = combine_rows(s.dxn, s.dxn_l, T);
  MT_PROF("bwd.norm", cuda::norm_backward_add(s.dres, s.dres16, g(lw.ln2_w), g(lw.ln2_b), dmlp, r.x_mid, r.mean2, r.rstd2, w(lw.ln2_w), Tl, h, D.rms,
                                              stream_, dt_, res16_, drop(mb, attn_site(l), row0(T))));
  // Attention
  dy = gather_rows(s.dres16, s.dres16_full, T);
  MT_PROF("bwd.gemm.proj_dgrad", lt.gemm_ex(false, false, T, Hd, h, 1.0f, dy, h, w(lw.proj_w), Hd, 0.0f, s.d_o, Hd, ab_, ab_, nullptr, stream_));
  // Under TP the projection's weight gradient waits for the side stream beside the QKV dgrad's collective,
  // which is longer than the QKV weight gradient alone: off the critical path (its dy is read before the
  // norm's backward below overwrites it).
  const bool defer_proj = wgrad_stream_ != nullptr;
  if (!defer_proj) wgrad_with_bias(stream_, "bwd.gemm.proj_wgrad", h, T, dy, r.o, Hd, lw.proj_w, fuse_row ? lw.proj_b : -1);
  if (!fuse_row && lw.proj_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.proj_b), s.dres16, Tl, h, stream_, dt_));
  MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward({mb.B, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_}, r.q, r.k, r.v, r.o, s.d_o,
                                                                r.stats, s.dq, s.dk, s.dv, stream_));
  if (D.qk_norm) {  // RoPE undone, then the norms' backward (the residual-gradient slot as zeroed scratch)
    if (D.rope) {
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dq, mb.positions, rope_table_, T, D.nh_local, D.d, D.rot_dim, -1.0f, stream_, dt_));
      MT_PROF("bwd.rope", cuda::rope_apply_16(s.dk, mb.positions, rope_table_, T, D.ng_local, D.d, D.rot_dim, -1.0f, stream_, dt_));
    }
    const int64_t Tq = T * D.nh_local, Tk = T * D.ng_local;
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.qk_tmp, 0, static_cast<size_t>(Tq * D.d) * 4, stream_)));
    MT_PROF("bwd.qk_norm", cuda::norm_backward_add(s.qk_tmp, s.dq_pre, g(lw.qn_w), lw.qn_b >= 0 ? g(lw.qn_b) : nullptr, s.dq, r.q_pre, r.qn_mean,
                                                   r.qn_rstd, w(lw.qn_w), Tq, D.d, D.rms, stream_, dt_, true));
    MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.qk_tmp, 0, static_cast<size_t>(Tk * D.d) * 4, stream_)));
    MT_PROF("bwd.qk_norm", cuda::norm_backward_add(s.qk_tmp, s.dk_pre, g(lw.kn_w), lw.kn_b >= 0 ? g(lw.kn_b) : nullptr, s.dk, r.k_pre, r.kn_mean,
                                                   r.kn_rstd, w(lw.kn_w), Tk, D.d, D.rms, stream_, dt_, true));
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward(s.qkv, s.dq_pre, s.dk_pre, s.dv, mb.positions, nullptr, T, D.nh_local, D.ng_local,
                                                                D.d, D.rot_dim, stream_, dt_));
    // Each TP rank's heads add to the shared norm weights: summed over TP here (under SP with the layer's
    // other replicated parameters).
    if (tp_ && !sp_ && final_backward_) {
      tp_->group_start();
      for (int64_t off : {lw.qn_w, lw.qn_b, lw.kn_w, lw.kn_b}) {
        if (off >= 0) tp_->all_reduce_on(g(off), D.d, WireType::kF32, ReduceOp::kSum, stream_);
      }
      MT_PROF("tp.qk_norm_grads", tp_->group_end());
    }
  } else if (!kv_group_) {
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward(s.qkv, s.dq, s.dk, s.dv, mb.positions, D.rope ? rope_table_ : nullptr, T, D.nh_local,
                                                                D.ng_local, D.d, D.rot_dim, stream_, dt_));
  } else {  // zero for the group's query heads other ranks own: their gradients arrive in the replica sum
    MT_PROF("bwd.qkv_merge_rope", copy_own_heads(s.dq, s.q_all, T, true));
    MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward(s.qkv, s.q_all, s.dk, s.dv, mb.positions, D.rope ? rope_table_ : nullptr, T, D.qh_local,
                                                                D.ng_local, D.d, D.rot_dim, stream_, dt_));
  }
  MT_PROF("bwd.gemm.qkv_dgrad", lt.gemm_ex(false, false, T, h, Wq, 1.0f, s.qkv, Wq, w(lw.qkv_w), h, 0.0f, s.dxn, h, ab_, ab_, nullptr, stream_));
  if (!bgrad_epilogue_ && lw.qkv_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), s.qkv, T, Wq, stream_, dt_));
  ws = fork_wgrad();
  if (defer_proj) {
    wgrad_with_bias(ws, "bwd.gemm.proj_wgrad", h, T, dy, r.o, Hd, lw.proj_w, fuse_row ? lw.proj_b : -1);
    MT_CUDA_CHECK(cudaEventRecord(proj_done_ev_, ws));
  }
  wgrad_with_bias(ws, "bwd.gemm.qkv_wgrad", Wq, T, s.qkv, r.xn1, h, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
  const bf16* dattn = combine_rows(s.dxn, s.dxn_l, T);
  if (defer_proj && !sp_) MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, proj_done_ev_, 0));  // under SP dy is dres16_full
  MT_PROF("bwd.norm", cuda::norm_backward_add(s.dres, s.dres16, g(lw.ln1_w), g(lw.ln1_b), dattn, x_in, r.mean1, r.rstd1, w(lw.ln1_w), Tl, h, D.rms,
                                              stream_, dt_, res16_, l > 0 ? drop(mb, mlp_site(l - 1), row0(T)) : nullptr));
  sum_replicated_grads(layer_replicated_[static_cast<size_t>(l)], stream_);
  // The side stream's GEMMs read this layer's saved inputs and s_->dfc1 / s_->qkv, which the next layer
  // (or its recompute) overwrites, and their gradients must be final before the grads-ready hook.
  MT_PROF("tp.wgrad_join", join_wgrad());
  if (kv_group_ && final_backward_) {
    // Every replica of the group's QKV block gets the sum: its own query heads' rows from their owner, and
    // the K/V rows from all the group's query heads.
    kv_group_->group_start();
    kv_group_->all_reduce_on(g(lw.qkv_w), static_cast<int64_t>(Wq) * h, WireType::kF32, ReduceOp::kSum, stream_);
    if (lw.qkv_b >= 0) kv_group_->all_reduce_on(g(lw.qkv_b), Wq, WireType::kF32, ReduceOp::kSum, stream_);
    MT_PROF("tp.kv_replica_grads", kv_group_->group_end());
  }
}

// The split TP backward (with the split forward): each layer's MLP and attention blocks as two halves of
// the micro batch's sequences; a half's input-gradient all-reduce and the norm backward that consumes it run
// on tp_stream_ while the compute stream runs the other half's GEMMs and attention. The weight gradients
// accumulate half by half. s_->dres / dres16 as in layer_backward.
void CudaGPT::split_layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  mlp_backward_half(l, 0, r, mb);
  mlp_backward_half(l, 1, r, mb);
  attention_backward_half(l, 0, r, mb);
  attention_backward_half(l, 1, r, mb);
  // The output layer's weight gradient (side stream) before any grads-ready hook or the embedding backward,
  // which adds to the same tensor when tied.
  MT_PROF("tp.wgrad_join", join_wgrad());
}

void CudaGPT::mlp_backward_half(int64_t l, int64_t half, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t rows = mb.B / 2 * mb.S, r0 = half * rows, h = D.h, F = W_.F, F1 = W_.F1;
  if (l + 1 < D.L) wait_reduced(half);  // the layer above's input-gradient norm of these rows (under SP, and gather)
  // This rank's piece of the half (the output gradient's rows the row-parallel bias gradient takes under SP),
  // and the half's output gradient (gathered under SP).
  const int64_t pr = piece(rows), p0 = half * pr;
  const bf16* dy = sp_ ? s.dres16_full + r0 * h : s.dres16 + r0 * h;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  bf16* dfc1 = s.dfc1 + r0 * F1;
  if (D.swiglu) {
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, rows, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, s.dact + r0 * F, F, ab_, ab_, nullptr, stream_));
  } else {
    MT_PROF("bwd.gemm.fc2_dgrad", lt.gemm_ex(false, false, rows, F, h, 1.0f, dy, h, w(lw.fc2_w), F, 0.0f, dfc1, F, ab_, ab_, nullptr, stream_,
                                             {cuda::GemmEpilogue::kDGelu, r.fc1 + r0 * F, F}));
  }
  wgrad_with_bias(stream_, "bwd.gemm.fc2_wgrad", h, rows, dy, r.act + r0 * F, F, lw.fc2_w, fuse_row ? lw.fc2_b : -1);
  if (!fuse_row && lw.fc2_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc2_b), s.dres16 + p0 * h, pr, h, stream_, dt_));
  if (D.swiglu) MT_PROF("bwd.activation", cuda::swiglu_backward_bf16(dfc1, s.dact + r0 * F, r.fc1 + r0 * F1, rows, F, stream_, dt_));
  MT_PROF("bwd.gemm.fc1_dgrad", lt.gemm_ex(false, false, rows, h, F1, 1.0f, dfc1, F1, w(lw.fc1_w), h, 0.0f, s.dxn + r0 * h, h, ab_, ab_, nullptr, stream_));
  if (!bgrad_epilogue_ && lw.fc1_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.fc1_b), dfc1, rows, F1, stream_, dt_));
  // The reduction and the norm start beside this half's fc1 weight gradient: the norm writes dres / dres16
  // (and under SP the gather dres16_full), which fc2's weight gradient (queued before) read, not what fc1's reads.
  void* x_mid = r.x_mid;
  reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add(s.dres + p0 * h, s.dres16 + p0 * h, g(lw.ln2_w), g(lw.ln2_b), sum, res_at(x_mid, p0 * h),
                                                       r.mean2 + p0, r.rstd2 + p0, w(lw.ln2_w), pr, h, D.rms, st, dt_, res16_,
                                                       drop(mb, attn_site(l), row0(mb.B * mb.S) + p0), s.norm_part, parts));
    if (sp_) gather_half(half, rows, s.dres16, s.dres16_full, st);
  });
  wgrad_with_bias(stream_, "bwd.gemm.fc1_wgrad", F1, rows, dfc1, r.xn2 + r0 * h, h, lw.fc1_w, bgrad_epilogue_ ? lw.fc1_b : -1);
}

void CudaGPT::attention_backward_half(int64_t l, int64_t half, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t Bh = mb.B / 2, rows = Bh * mb.S, r0 = half * rows, h = D.h;
  const int64_t Hd = W_.Hd, KVd = W_.KVd, Wq = W_.Wq;
  wait_reduced(half);  // the MLP's input-gradient norm of these rows (under SP, and gather)
  const int64_t pr = piece(rows), p0 = half * pr;
  const bf16* dy = sp_ ? s.dres16_full + r0 * h : s.dres16 + r0 * h;
  const bool fuse_row = bgrad_epilogue_ && !sp_;
  MT_PROF("bwd.gemm.proj_dgrad", lt.gemm_ex(false, false, rows, Hd, h, 1.0f, dy, h, w(lw.proj_w), Hd, 0.0f, s.d_o + r0 * Hd, Hd, ab_, ab_, nullptr, stream_));
  wgrad_with_bias(stream_, "bwd.gemm.proj_wgrad", h, rows, dy, r.o + r0 * Hd, Hd, lw.proj_w, fuse_row ? lw.proj_b : -1);
  if (!fuse_row && lw.proj_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.proj_b), s.dres16 + p0 * h, pr, h, stream_, dt_));
  const cuda::SdpaShape sh{Bh, mb.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
  MT_PROF("bwd.attention", cuda::CudnnSdpa::instance().backward(sh, r.q + r0 * Hd, r.k + r0 * KVd, r.v + r0 * KVd, r.o + r0 * Hd, s.d_o + r0 * Hd,
                                                                r.stats + half * Bh * D.nh_local * mb.S, s.dq + r0 * Hd, s.dk + r0 * KVd,
                                                                s.dv + r0 * KVd, stream_));
  MT_PROF("bwd.qkv_merge_rope", cuda::qkv_merge_rope_backward(s.qkv + r0 * Wq, s.dq + r0 * Hd, s.dk + r0 * KVd, s.dv + r0 * KVd, layer_positions(mb) + r0,
                                                              D.rope ? rope_table_ : nullptr, rows, D.nh_local, D.ng_local, D.d, D.rot_dim, stream_, dt_));
  MT_PROF("bwd.gemm.qkv_dgrad", lt.gemm_ex(false, false, rows, h, Wq, 1.0f, s.qkv + r0 * Wq, Wq, w(lw.qkv_w), h, 0.0f, s.dxn + r0 * h, h, ab_, ab_, nullptr,
                                           stream_));
  if (!bgrad_epilogue_ && lw.qkv_b >= 0) MT_PROF("bwd.bias_grad", cuda::bias_grad_bf16(g(lw.qkv_b), s.qkv + r0 * Wq, rows, Wq, stream_, dt_));
  // As in the MLP: the reduction and the norm beside this half's QKV weight gradient (which reads s.qkv and
  // xn1; the projection's, which read dres16 or under SP dres16_full, is queued before).
  // Under SP the gather feeds the layer below (the embedding's backward takes the fp32 gradient instead),
  // and after the second half the layer's replicated gradients (norms, row-parallel biases) are summed over
  // TP on the TP stream, behind the norms that finish them.
  void* x_in = records_[static_cast<size_t>(l)]->x_in;
  reduce_half(half, rows, s.dxn, s.dxn_l, [&](cudaStream_t st, const bf16* sum, cuda::Partials parts) {
    MT_PROF_ON(st, "bwd.norm", cuda::norm_backward_add(s.dres + p0 * h, s.dres16 + p0 * h, g(lw.ln1_w), g(lw.ln1_b), sum, res_at(x_in, p0 * h),
                                                       r.mean1 + p0, r.rstd1 + p0, w(lw.ln1_w), pr, h, D.rms, st, dt_, res16_,
                                                       l > 0 ? drop(mb, mlp_site(l - 1), row0(mb.B * mb.S) + p0) : nullptr, s.norm_part, parts));
    if (sp_ && l > 0) gather_half(half, rows, s.dres16, s.dres16_full, st);
  });
  // After the half's event, so that the layer below's first half does not wait for it (wait_tp_stream does).
  if (half == 1) sum_replicated_grads(layer_replicated_[static_cast<size_t>(l)], tp_stream_);
  wgrad_with_bias(stream_, "bwd.gemm.qkv_wgrad", Wq, rows, s.qkv + r0 * Wq, r.xn1 + r0 * h, h, lw.qkv_w, bgrad_epilogue_ ? lw.qkv_b : -1);
}

// The residual stream's first rows: the vocabulary-parallel lookup summed over TP (scattered over the
// tokens under SP), positions added by one rank.
void CudaGPT::embed(const DeviceMicrobatch& mb, int64_t T) {
  const ModelDims& D = D_;
  void* x0 = records_[0]->x_in;
  const bf16* wpe = wpe_ >= 0 && tp_rank_ == 0 ? w(wpe_) : nullptr;
  // The sum is taken in fp32 (in s_->emb unless the stream is fp32 and whole), then rounded once into a
  // 16-bit stream; without positions or dropout, a 16-bit stream is summed in 16 bits (exact, see below).
  float* out = sp_ || res16_ ? s_->emb : static_cast<float*>(x0);
  MT_PROF("fwd.embedding", cuda::embedding_forward_bf16(out, mb.tokens, mb.positions, w(wte_), wpe, T, D.h, v0_, D.V_local, stream_, dt_));
  int64_t n = T * D.h;
  if (tp_ && sp_) {
    n = T / tp_size_ * D.h;
    float* mine = res16_ ? out + tp_rank_ * n : static_cast<float*>(x0);  // in place: this rank's block of `out`
    MT_PROF("tp.reduce_scatter", tp_->reduce_scatter_on(out, mine, n, WireType::kF32, stream_));
    out = mine;
  } else if (tp_) {
    // Each token's row comes from the one rank that holds it and the others add exact zeros: without learned
    // positions or dropout to add before rounding, the sum is exact in 16 bits, on half the bytes.
    if (res16_ && wpe_ < 0 && !drop(mb, kEmbedSite, row0(T))) {
      MT_PROF("fwd.embedding", cuda::cast_to_bf16(static_cast<bf16*>(x0), out, n, stream_, dt_));
      MT_PROF("tp.all_reduce", tp_->all_reduce_on(x0, n, wire_, ReduceOp::kSum, stream_));
      return;
    }
    MT_PROF("tp.all_reduce", tp_->all_reduce_on(out, n, WireType::kF32, ReduceOp::kSum, stream_));
  }
  if (const cuda::RowDropout* d = drop(mb, kEmbedSite, row0(T))) MT_PROF("fwd.dropout", cuda::dropout_rows_f32(out, n / D.h, D.h, *d, stream_));
  if (res16_) MT_PROF("fwd.embedding", cuda::cast_to_bf16(static_cast<bf16*>(x0), out, n, stream_, dt_));
}

// Cross-entropy over this rank's vocabulary columns (the whole vocabulary at TP 1); the gradient replaces
// the logits when training.
void CudaGPT::loss(const DeviceMicrobatch& mb, float grad_scale, int64_t T) {
  Scratch& s = *s_;
  const bool train = grad_scale > 0.0f;
  if (!tp_) {
    MT_PROF("loss.cross_entropy", cuda::cross_entropy_fused_bf16(s.losses, s.logits, mb.labels, mb.loss_mask, grad_scale, T, D_.V, train, stream_, dt_, loss_scale_));
    return;
  }
  MT_PROF("loss.cross_entropy", cuda::ce_shard_stats(s.ce_stats, s.logits, mb.labels, T, D_.V_local, v0_, stream_, dt_));
  MT_PROF("tp.loss_max", tp_->all_reduce_on(s.ce_stats, T, WireType::kF32, ReduceOp::kMax, stream_));
  MT_PROF("loss.cross_entropy", cuda::ce_shard_rescale(s.ce_stats, T, stream_));
  MT_PROF("tp.loss_sum", tp_->all_reduce_on(s.ce_stats + 2 * T, 2 * T, WireType::kF32, ReduceOp::kSum, stream_));
  MT_PROF("loss.cross_entropy", cuda::ce_shard_finish(s.losses, s.logits, s.ce_stats, mb.labels, mb.loss_mask, grad_scale, T, D_.V_local, v0_, train,
                                                      stream_, dt_, loss_scale_));
}

void CudaGPT::step(const DeviceMicrobatch& mb, float grad_scale, float loss_weight, float* loss_acc) {
  const ModelDims& D = D_;
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, Tl = local_rows(T), h = D.h, V = D.V_local;
  if (T > T_max_ || mb.S != D.S) throw std::logic_error("CUDA model: microbatch larger than the buffers");
  if (split_forward_ && sp_ && T != T_max_) throw std::logic_error("CUDA model: the split layers under SP need micro batches of the configured size");
  auto act = [&](int64_t l) -> Record& { return recomputed(l) ? *recompute_record_ : *records_[static_cast<size_t>(l)]; };
  // The split layers under SP take their [T, .] rows in half-major order (see piece()): the first layer's
  // input norm and the last layer's output gradient are gathered half by half, and the positions permuted
  // the same way.
  const bool split_sp = split_forward_ && sp_;
  auto gather_layer_rows = [&](bf16* local, bf16* full) {
    if (!split_sp) return gather_rows(local, full, T);
    for (int64_t half = 0; half < 2; ++half) gather_half(half, T / 2, local, full, stream_);
    return full;
  };
  if (split_sp) {  // half k's rows: piece k of each rank's Tl, rank after rank
    const auto pr = static_cast<size_t>(Tl / 2);
    for (int64_t half = 0; half < 2; ++half) {
      MT_CUDA_CHECK(cudaMemcpy2DAsync(s.half_pos + half * (T / 2), pr * 4, mb.positions + half * Tl / 2, static_cast<size_t>(Tl) * 4, pr * 4,
                                      static_cast<size_t>(tp_size_), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  // Forward
  need_params(embed_end_);
  embed(mb, T);
  need_params(layer_end_[0]);
  const LayerW& l0 = layers_[0];
  MT_PROF("fwd.add_norm", cuda::add_norm_forward(nullptr, norm_out(act(0).xn1), act(0).mean1, act(0).rstd1, records_[0]->x_in, nullptr, w(l0.ln1_w),
                                                 w(l0.ln1_b), Tl, h, D.eps, D.rms, stream_, dt_, res16_));
  gather_layer_rows(s.xn_l, act(0).xn1);
  if (split_forward_) {
    split_layers_forward(mb);
    need_params(numel_);
    MT_PROF("fwd.add_norm", cuda::add_norm_forward(s.x_final, norm_out(s.xnf), s.meanf, s.rstdf, act(D.L - 1).x_mid, sp_ ? s.delta_l : s.delta, w(lnf_w_),
                                                   w(lnf_b_), Tl, h, D.eps, D.rms, stream_, dt_, res16_, drop(mb, mlp_site(D.L - 1), row0(T))));
    gather_rows(s.xn_l, s.xnf, T);
  }
  for (int64_t l = 0; !split_forward_ && l < D.L; ++l) {
    Record& r = act(l);
    const bf16* mlp = layer_forward(l, r, mb);
    if (l + 1 < D.L) {
      Record& n = act(l + 1);
      const LayerW& nw = layers_[static_cast<size_t>(l + 1)];
      need_params(layer_end_[static_cast<size_t>(l + 1)]);
      MT_PROF("fwd.add_norm", cuda::add_norm_forward(records_[static_cast<size_t>(l + 1)]->x_in, norm_out(n.xn1), n.mean1, n.rstd1, r.x_mid, mlp, w(nw.ln1_w),
                                                     w(nw.ln1_b), Tl, h, D.eps, D.rms, stream_, dt_, res16_, drop(mb, mlp_site(l), row0(T))));
      gather_rows(s.xn_l, n.xn1, T);
    } else {
      need_params(numel_);
      MT_PROF("fwd.add_norm", cuda::add_norm_forward(s.x_final, norm_out(s.xnf), s.meanf, s.rstdf, r.x_mid, mlp, w(lnf_w_), w(lnf_b_), Tl, h, D.eps, D.rms,
                                                     stream_, dt_, res16_, drop(mb, mlp_site(D.L - 1), row0(T))));
      gather_rows(s.xn_l, s.xnf, T);
    }
  }
  MT_PROF("fwd.gemm.logits", lt.gemm_ex(false, true, T, V, h, 1.0f, s.xnf, h, w(out_w_), h, 0.0f, s.logits, V, ab_, ab_, nullptr, stream_));
  loss(mb, grad_scale, T);
  MT_PROF("loss.sum", cuda::masked_loss_sum(loss_acc, s.losses, mb.loss_mask, T, loss_weight, stream_));
  if (grad_scale <= 0.0f) return;
  // Backward: output layer and final norm
  MT_PROF("bwd.gemm.logits_dgrad", lt.gemm_ex(false, false, T, h, V, 1.0f, s.logits, V, w(out_w_), h, 0.0f, s.dxn, h, ab_, ab_, nullptr, stream_));
  // Joined at the end of the last layer's backward (before any grads-ready hook or the embedding backward,
  // which adds to the same tensor when tied).
  cudaStream_t ws = fork_wgrad();
  MT_PROF_ON(ws, "bwd.gemm.logits_wgrad", lt.gemm_ex(true, false, V, h, T, 1.0f, s.logits, V, s.xnf, h, 1.0f, g(out_w_), h, ab_, CUDA_R_32F, nullptr, ws));
  const bf16* dfinal = combine_rows(s.dxn, s.dxn_l, T);
  MT_PROF("bwd.memset", MT_CUDA_CHECK(cudaMemsetAsync(s.dres, 0, static_cast<size_t>(Tl * h) * 4, stream_)));
  MT_PROF("bwd.norm", cuda::norm_backward_add(s.dres, s.dres16, g(lnf_w_), g(lnf_b_), dfinal, s.x_final, s.meanf, s.rstdf, w(lnf_w_), Tl, h, D.rms,
                                              stream_, dt_, res16_, drop(mb, mlp_site(D.L - 1), row0(T))));
  sum_replicated_grads(final_replicated_, stream_);
  for (int64_t l = D.L - 1; l >= 0; --l) {
    Record& r = act(l);
    // The split backward's norms of the layer above may still read the shared recompute record on tp_stream_.
    if (split_forward_ && recomputed(l) && l + 1 < D.L) {
      wait_reduced(0);
      wait_reduced(1);
    }
    if (recomputed(l)) {
      const LayerW& lw = layers_[static_cast<size_t>(l)];
      MT_PROF("recompute.norm", cuda::add_norm_forward(nullptr, norm_out(r.xn1), r.mean1, r.rstd1, records_[static_cast<size_t>(l)]->x_in, nullptr,
                                                       w(lw.ln1_w), w(lw.ln1_b), Tl, h, D.eps, D.rms, stream_, dt_, res16_));
      gather_rows(s.xn_l, r.xn1, T);
      layer_forward(l, r, mb);
    }
    if (split_forward_) {
      if (split_sp && l + 1 == D.L) gather_layer_rows(s.dres16, s.dres16_full);  // the final norm's input gradient
      split_layer_backward(l, r, mb);
    } else {
      layer_backward(l, r, mb);
    }
    if (final_backward_ && grads_ready_) {
      // The layer's norm gradients come from tp_stream_; the hook's collectives follow the compute stream.
      // (A wait even when the hook launches nothing: TP x DP without SP loses some overlap here.)
      if (split_forward_) wait_tp_stream();
      grads_ready_(layer_start_[static_cast<size_t>(l)]);
    }
  }
  // The input gradient's last rows, before the embedding reads them, and the replicated gradients' sums
  // (the optimizer follows the compute stream).
  if (split_forward_) wait_tp_stream();
  // The embedding gradient from every token (gathered under SP): each rank's vocabulary rows, and the
  // positions' on every rank alike.
  float* demb = s.dres;
  if (const cuda::RowDropout* d = drop(mb, kEmbedSite, row0(T))) MT_PROF("bwd.dropout", cuda::dropout_rows_f32(s.dres, Tl, h, *d, stream_));
  if (sp_) {
    MT_PROF("tp.all_gather", tp_->all_gather_on(s.dres, s.emb, Tl * h, WireType::kF32, stream_));
    demb = s.emb;
  }
  MT_PROF("bwd.embedding", cuda::embedding_backward(g(wte_), demb, mb.tok_ids, mb.tok_offsets, mb.tok_positions, mb.n_tok_ids, h, stream_));
  if (wpe_ >= 0) MT_PROF("bwd.embedding", cuda::embedding_backward(g(wpe_), demb, mb.pos_ids, mb.pos_offsets, mb.pos_positions, mb.n_pos_ids, h, stream_));
  if (final_backward_ && grads_ready_) grads_ready_(0);
}

}  // namespace mt
