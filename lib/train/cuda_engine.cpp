// cuda_engine.cpp: the CUDA engine's set-up: the shared layout on the host, checkpoint loading, the model and
// its NCCL groups, the optimizer state (whole, or this rank's shard under the distributed optimizer), the
// multi-tensor chunk table, data parallelism and the staging buffers. The steps: cuda_engine_step.cpp.
#include "train/cuda_engine.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "config/optimizer_state.h"
#include "optim/batch_schedule.h"
#include "pipeline/configured_schedule.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/device_info.h"
#include "train/moe_report.h"
#include "train/train_common.h"

namespace mt {
namespace {

double peak_of(const std::string& gpu) {
  // Dense bf16 tensor-core peak of the SXM parts (REFERENCE.md section 3 uses 989.4 for H100/H200).
  if (gpu.find("H100") != std::string::npos || gpu.find("H200") != std::string::npos) return 989.4;
  return -1;
}

template <typename T>
T* device_zeros(size_t n) {
  auto* p = static_cast<T*>(device_malloc(std::max<size_t>(n, 1) * sizeof(T), "the training state (master weights, Adam moments, step buffers)"));
  MT_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)));
  // The training stream is non-blocking (not ordered with the legacy stream this memset runs on).
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  return p;
}

}  // namespace

CudaEngine::CudaEngine(const Config& cfg, ProcessGroups groups, const TokenSource& data, bool lead)
    : cfg_(cfg), groups_(std::move(groups)), data_(data), lead_(lead), scaler_(cfg) {
  // (refused by name in train/capabilities: a guard for other callers)
  if (cfg.training.decoupled_lr) decoupled_.emplace(cfg, true);
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const auto gpus = visible_gpus();
  gpu_name_ = gpus.empty() ? std::string("GPU") : gpus.front().name;
  peak_ = peak_of(gpu_name_);
  // The host parameters: the layout both engines build, with the initial values (the same as the CPU engine's);
  // with checkpoints they stay as the host side of save / load, otherwise they are dropped after upload.
  const auto& ck = cfg.checkpoint;
  host_ = std::make_unique<ParamStore>();
  // One layout per model chunk of this stage (interleaving: every virtual stage of this rank), one store.
  // (expert parallelism: this rank's experts; expert-TP: their shards)
  chunk_layouts_ = build_model_chunks(cfg,
                                      {groups_.tp->rank(), groups_.tp->size(), groups_.pp->rank(), groups_.pp->size(), groups_.ep->rank(), groups_.ep->size(),
                                       groups_.expert_tp->rank(), groups_.expert_tp->size()},
                                      *host_);
  host_->release_grads();  // the gradients live on the device
  dp_ = groups_.dp_cp->size();
  dp_rank_ = groups_.dp_cp->rank();
  // The distributed optimizer (ZeRO-1): this DP rank keeps the master weights and Adam moments of its
  // blocks of the CPU engine's gradient buckets only (the same split, so checkpoints and the host optimizer
  // line up); the optimizer state lies back to back in segment order (Optimizer::make_segments).
  dist_opt_ = cfg.training.use_distributed_optimizer && dp_ > 1;
  offloading_ = cfg.training.optimizer_cpu_offload;
  overlap_gather_ = dist_opt_ && cfg.training.overlap_param_gather;
  if (offloading_ && overlap_gather_) {  // (refused by name in train/capabilities: a guard for other callers)
    throw std::runtime_error("--optimizer-cpu-offload with --overlap-param-gather is not implemented on the CUDA engine: drop --overlap-param-gather");
  }
  FlatRanges owned{{0, host_->numel()}};
  if (dist_opt_) {
    shard_layout_ = std::make_unique<DataParallel>(cfg, *host_, groups_.dp_cp);
    owned = shard_layout_->owned_ranges();
    if (host_->has_experts()) {  // (as the CPU engine shards them: model/layout's expert group over expert-DP)
      // (Megatron's folding: the expert grid, expert-TP x EP x expert-DP, spans the ranks of TP x DP x CP)
      if (groups_.expert_dp->size() * groups_.ep->size() * groups_.expert_tp->size() != dp_ * groups_.tp->size()) {
        throw std::logic_error("CUDA engine: expert-TP x EP x expert-DP must be TP x DP x CP");
      }
      expert_layout_ = std::make_unique<DataParallel>(cfg, *host_, groups_.expert_dp, GradGroup::kExpert);
      for (const auto& r : expert_layout_->owned_ranges()) owned.push_back(r);
    }
  }
  const std::vector<Optimizer::Segment> segments = Optimizer::make_segments(*host_, owned);
  n_state_ = segments.empty() ? 0 : segments.back().state + (segments.back().end - segments.back().begin);
  // The host optimizer (fp32 master weights, Adam moments) exists only to load or save checkpoints.
  if (ck.load || ck.save) host_opt_ = std::make_unique<Optimizer>(cfg, *host_, groups_, owned, dist_opt_);
  const bool found = checkpoint_to_load(cfg);
  if (found) {
    const LoadOptions lo = load_options(cfg);
    resumed_ = load_checkpoint(*ck.load, lo, *host_, *host_opt_, scaler_);
    loaded_ = lo.load_optimizer;
  }
  announce_load(cfg, resumed_, found, lead);
  P_ = host_->numel();
  // Without the distributed optimizer one rank owns every range: the state is laid out like the parameters.
  for (const auto& sg : segments) {
    if (!dist_opt_ && sg.state != sg.begin) throw std::logic_error("CUDA engine: optimizer state not aligned with the parameters");
  }
  // Pipeline parallelism: this rank's stage holds at most the schedule's peak of microbatches in flight.
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const BatchSchedule batches(cfg, groups_.dp->size());
  nmb_max_ = batches.max_global_batch() / (mbs * groups_.dp->size());
  pp_ = groups_.pp->size();
  pp_rank_ = groups_.pp->rank();
  // Each chunk's activation slots: the most of its microbatches in flight at once under the schedule.
  const Schedule schedule = training_schedule(cfg, pp_rank_, pp_, nmb_max_);
  auto in_flight = [&](int64_t chunk) {
    Schedule mine;
    for (const ScheduleAction& a : schedule) {
      if (a.chunk == chunk) mine.push_back(a);
    }
    return std::max<int64_t>(1, peak_in_flight(mine));
  };
  // Tensor parallelism: the model queues its collectives on the training stream through the TP group.
  StreamCollectives* tp_coll = nullptr;
  StreamCollectives* dp_coll = nullptr;
#ifdef MEGATRAIN_HAVE_NCCL
  if (groups_.tp->size() > 1) {
    tp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.tp);
    if (!tp_nccl_) throw std::logic_error("CUDA engine: the tensor-parallel group is not an NCCL communicator");
    tp_coll = tp_nccl_.get();
  }
  // Data parallelism: the gradient (and, with the distributed optimizer, 16-bit weight) buffers go into the DP
  // group's symmetric windows, which the communicator owns.
  if (dp_ > 1) {
    dp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.dp_cp);
    if (!dp_nccl_) throw std::logic_error("CUDA engine: the data-parallel group is not an NCCL communicator");
  }
  dp_coll = dp_nccl_.get();
  if (pp_ > 1) {
    pp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.pp);
    if (!pp_nccl_) throw std::logic_error("CUDA engine: the pipeline group is not an NCCL communicator");
    link_ = std::make_unique<NcclStageLink>(*pp_nccl_);
    // Tied embeddings across the stages: the first stage's word embeddings and the last stage's copy.
    const ModelLayout &first = chunk_layouts_.front(), &last = chunk_layouts_.back();
    const size_t tied = cfg.model.untie_embeddings_and_output_weights ? kNoParam : first.pre_process ? first.word_embeddings : last.post_process ? last.output_w : kNoParam;
    if (tied != kNoParam) {
      embedding_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.embedding);
      if (!embedding_nccl_) throw std::logic_error("CUDA engine: the embedding group is not an NCCL communicator");
      tied_offset_ = host_->info(tied).offset;
      tied_numel_ = host_->info(tied).numel;
    }
  }
#else
  if (groups_.tp->size() > 1) throw std::logic_error("CUDA engine: tensor parallelism needs NCCL");
#endif
  // The model keeps the master weights when this rank updates every parameter on the device.
  const bool model_master = !dist_opt_ && !offloading_;
  model_ = std::make_unique<CudaGPT>(cfg, *host_, chunk_layouts_.front(), stream_, tp_coll, model_master, dp_coll, in_flight(0));
  chunks_models_.push_back(model_.get());
  for (size_t c = 1; c < chunk_layouts_.size(); ++c) {  // the other chunks in the first one's parameter buffers
    extra_chunks_.push_back(std::make_unique<CudaGPT>(cfg, *host_, chunk_layouts_[c], stream_, tp_coll, model_master, dp_coll,
                                                      in_flight(static_cast<int64_t>(c)), model_.get()));
    chunks_models_.push_back(extra_chunks_.back().get());
  }
  // Context parallelism: the ring attention's sends and receives over the CP group (each rank's share of a
  // microbatch: context_parallel_slice in the steps).
  cp_ = groups_.cp->size();
  cp_rank_ = groups_.cp->rank();
  if (cp_ > 1) {
#ifdef MEGATRAIN_HAVE_NCCL
    cp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.cp);
    if (!cp_nccl_) throw std::logic_error("CUDA engine: the context-parallel group is not an NCCL communicator");
    for (CudaGPT* m : chunks_models_) m->set_context_parallel(cp_nccl_.get());
#else
    throw std::logic_error("CUDA engine: context parallelism needs NCCL");
#endif
  }
  // Expert parallelism: the MoE layers' all-to-alls over the EP group (written, refused by name in train/capabilities
  // until it has run on several GPUs; the distributed optimizer required, so that every parameter's norm and update
  // is its owner's).
  if (groups_.ep->size() > 1) {
#ifdef MEGATRAIN_HAVE_NCCL
    // (refused by name in train/capabilities: guards for other callers. fp16's reductions average, which would scale the
    // experts' gradients by 1 / expert-DP instead of 1 / DP)
    // (without it only where each expert shard has one holder, so the TP sums of the norms meet every one: DP 1, expert-DP 1)
    if (!dist_opt_ && (dp_ > 1 || groups_.expert_dp->size() > 1)) throw std::logic_error("CUDA engine: expert parallelism without the distributed optimizer");
    if (cfg.precision.fp16) throw std::logic_error("CUDA engine: expert parallelism in fp16");
    // (EP = DP: the all-to-alls on the DP group's communicator, the same members in the same order, so that they and the
    // overlapped DP reductions are ordered by one communicator; EP < DP with the overlaps is refused by name)
    if (groups_.ep->size() == dp_ && groups_.expert_tp == groups_.tp) {  // (folded layouts: EP may be the TP group's ranks instead)
      if (groups_.ep->rank() != dp_rank_) throw std::logic_error("CUDA engine: EP = DP with another rank order");
      ep_nccl_ = dp_nccl_;
    } else {
      ep_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.ep);
    }
    if (!ep_nccl_) throw std::logic_error("CUDA engine: the expert-parallel group is not an NCCL communicator");
    for (CudaGPT* m : chunks_models_) m->set_expert_parallel(ep_nccl_.get());
#else
    throw std::logic_error("CUDA engine: expert parallelism needs NCCL");
#endif
  }
  // Expert-TP other than TP: the MoE layers' gathers and reduce-scatters of the experts' rows over the expert-TP group
  // (refused by name in train/capabilities until it has run on several GPUs). Its expert-DP group reduces and shards the
  // experts' gradients (setup_data_parallel), which needs the distributed optimizer where DP > 1, or one holder of each
  // expert shard where DP = 1.
  if (host_->has_experts() && groups_.expert_tp != groups_.tp) {
#ifdef MEGATRAIN_HAVE_NCCL
    if (cfg.precision.fp16) throw std::logic_error("CUDA engine: expert-TP other than TP in fp16");  // (refused by name: guards)
    if (!dist_opt_ && (dp_ > 1 || groups_.expert_dp->size() > 1)) {
      throw std::logic_error("CUDA engine: expert-TP other than TP without the distributed optimizer, or with expert-DP > 1 at DP 1");
    }
    if (groups_.expert_tp->size() > 1) {
      etp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.expert_tp);
      if (!etp_nccl_) throw std::logic_error("CUDA engine: the expert-tensor-parallel group is not an NCCL communicator");
      for (CudaGPT* m : chunks_models_) m->set_expert_tensor_parallel(etp_nccl_.get());
    }
#else
    throw std::logic_error("CUDA engine: expert tensor parallelism needs NCCL");
#endif
  }
  if (found && !cfg.moe.moe_use_upcycling) {  // FP8 delayed scaling: each chunk's scales and amax histories from the checkpoint
    for (CudaGPT* m : chunks_models_) {
      if (!m->fp8_delayed()) continue;
      Fp8ScalingState st = m->fp8_scaling_state();
      restore_fp8_scaling(cfg, st, lead && m == chunks_models_.front());
      m->set_fp8_scaling_state(st);
    }
  }
  if (pp_ > 1) {
    // (a microbatch's rows on this rank: its two chunks of each sequence under context parallelism)
    boundary_activations_ = std::make_unique<StageBuffers>(model_->boundary_activation_bytes(mbs * S / cp_));
    boundary_gradients_ = std::make_unique<StageBuffers>(model_->boundary_gradient_bytes(mbs * S / cp_));
  }
  // Data-parallel rank 0 writes the parameters; the optimizer state is written by rank 0 (every replica
  // holds the same) or, with the distributed optimizer, by every rank for its shard. Ranks that write keep
  // the host parameters and optimizer after the upload; the others take part in the save with an empty shard.
  keep_host_ = ck.save.has_value() && (dp_rank_ == 0 || dist_opt_);
  setup_optimizer_state(segments);
  setup_data_parallel();
  shard_layout_.reset();  // refers to the host parameters; its buckets were copied
  expert_layout_.reset();
  if (!keep_host_) {
    host_opt_.reset();
    host_.reset();
  }
  // The staging buffers: two sets of the largest batch's microbatches (iterations alternate), one for evaluation.
  // Hidden dropout: each training micro batch carries its samples' mask keys (dropout_key: the embedding,
  // then per layer the attention block's and the MLP's output), the CPU engine's masks.
  const int64_t key_sites = 1 + 2 * model_->dims().L;
  for (int64_t i = 0; i < 2 * nmb_max_; ++i) {
    slots_.push_back(std::make_unique<MicrobatchSlot>(mbs * S, cfg.model.hidden_dropout > 0 ? mbs * key_sites : 0));
  }
  // Evaluation: one staging slot, or under interleaving one per microbatch of a group (--microbatch-group-size-per-virtual-
  // pipeline-stage, default PP: a group's chunks all run before the next group is staged).
  const int64_t eval_slots = chunks_models_.size() > 1 ? microbatch_group_size(cfg) : 1;
  for (int64_t i = 0; i < eval_slots; ++i) eval_slots_.push_back(std::make_unique<MicrobatchSlot>(mbs * S));
  eval_acc_ = device_zeros<float>(1);
  const auto hist = static_cast<size_t>(cfg.logging.log_interval) + 1;
  loss_hist_ = device_zeros<float>(hist);
  norm_hist_ = device_zeros<float>(hist);
  skip_hist_ = device_zeros<int32_t>(hist);
  if (cfg.logging.log_num_zeros_in_grad) zeros_hist_ = device_zeros<double>(hist);
  // (the MoE report's sums per step over the pipeline at most: the three load-balancing losses, the z-loss and the tokens
  // kept; with --moe-per-layer-logging each layer's four losses)
  const auto per_step = std::max<size_t>(5, cfg.moe.moe_per_layer_logging ? kMoeLossSlots * static_cast<size_t>(cfg.model.num_layers.value_or(0)) : 0);
  avg_buf_ = device_zeros<float>(per_step * hist);
  // (every chunk's MoE layers, chunk after chunk: under interleaving each chunk keeps its own statistics)
  for (const CudaGPT* m : chunks_models_) moe_row_ += m->moe_layer_count() * m->moe_stats_row();
  if (moe_row_ > 0) moe_hist_ = device_zeros<float>(hist * static_cast<size_t>(moe_row_));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&drained_, cudaEventDisableTiming));
  if (ck.save) saver_ = make_saver(cfg, groups_);
  // MEGATRAIN_PROFILE_ITER=N: per-op device time of iteration N (printed once, by rank 0).
  const char* prof_env = std::getenv("MEGATRAIN_PROFILE_ITER");
  profile_iter_ = prof_env ? std::atoll(prof_env) : -1;
}

// Master weights: the model's full buffer, or this rank's shard of them (distributed optimizer), filled from
// the host optimizer's copy when there is one (loaded, or initialised from the parameters) and else from the
// layout's parameters, still the unrounded initial values; the Adam moments, the step state and the chunk table.
void CudaEngine::setup_optimizer_state(const std::vector<Optimizer::Segment>& segments) {
  const Config& cfg = cfg_;
  // The multi-tensor table: chunks of at most 64 Ki elements of the owned segments, each inside one
  // parameter. A parameter n TP ranks hold (norms, row-parallel biases and positions: all TP ranks; a
  // K/V-replicated QKV shard: its group's ranks) counts 1/n in each rank's norm partials, which are then
  // summed over TP (and over DP with the distributed optimizer): every parameter once.
  const int64_t tp = groups_.tp->size(), etp = groups_.expert_tp->size();
  const bool explicit_state = dist_opt_ || offloading_;
  for (const auto& sg : segments) {
    const ParamInfo& p = host_->info(sg.param);
    // Held by tp / shard_count ranks: whole (shard_dim < 0) or a K/V-replicated shard. An expert's: by every expert-TP
    // rank where whole, else by one (its expert-TP shard; with the distributed optimizer one expert-DP rank's range, and
    // without it expert-DP is 1 or lies outside the TP group's sums).
    const int64_t holders = p.grad_group == GradGroup::kExpert ? (p.shard_dim < 0 ? etp : 1)
                            : p.shard_dim < 0                  ? tp
                                                               : tp / std::max<int64_t>(1, p.shard_count);
    // The last stage's copy of the tied word embeddings counts nothing: the first stage's holds the same.
    const float nw = p.tied_copy ? 0.0f : 1.0f / static_cast<float>(std::max<int64_t>(1, holders));
    for (int64_t o = 0; o < sg.end - sg.begin; o += 65536) {
      chunks_.push_back({sg.begin + o, static_cast<int32_t>(std::min<int64_t>(65536, sg.end - sg.begin - o)), p.weight_decay ? 1 : 0, nw,
                         explicit_state ? sg.state + o : -1, takes_decoupled_lr(p.name) ? 1 : 0});
    }
  }
  // In flat order, so each data-parallel bucket's chunks are one run of the table (the overlapped parameter
  // gather updates and sends the model bucket by bucket, lowest first).
  std::stable_sort(chunks_.begin(), chunks_.end(), [](const cuda::AdamChunk& a, const cuda::AdamChunk& b) { return a.start < b.start; });
  // Offloading: the chunks of the lowest state indices (the first parameters, as Megatron's HybridDeviceOptimizer
  // takes them) up to --optimizer-offload-fraction of the state go to the CPU; the device keeps the rest, its
  // state indices shifted down by the offloaded count.
  std::vector<cuda::AdamChunk> host_chunks;
  if (offloading_) {
    std::vector<cuda::AdamChunk> by_state = chunks_;
    std::stable_sort(by_state.begin(), by_state.end(), [](const cuda::AdamChunk& a, const cuda::AdamChunk& b) { return a.state < b.state; });
    const double want = cfg.training.optimizer_offload_fraction * static_cast<double>(n_state_);
    for (const cuda::AdamChunk& c : by_state) {  // (an alignment gap between two chunks' states goes with the first)
      if (static_cast<double>(c.state + c.len) > want + 0.5 || c.state < n_offloaded_) break;
      host_chunks.push_back(c);
      n_offloaded_ = c.state + c.len;
    }
  }
  for (cuda::AdamChunk c : chunks_) {
    if (offloading_ && c.state < n_offloaded_) continue;
    if (offloading_) c.state -= n_offloaded_;
    gpu_chunks_.push_back(c);
  }
  const int64_t n_gpu = n_state_ - n_offloaded_;
  const size_t gpu_bytes = static_cast<size_t>(n_gpu) * 4;

  // Master weights: the model's full buffer, or the device's share of them (distributed optimizer: this rank's
  // shard; offloading: the part not offloaded), from the host optimizer's copy when there is one (loaded, or
  // initialised from the parameters) and else from the layout's parameters, still the unrounded initial values.
  const float* master_src = host_opt_ && host_opt_->master() ? host_opt_->master() : nullptr;
  std::vector<float> init;
  if (!master_src && offloading_ && !dist_opt_) master_src = host_->params().f32();  // the state is laid out like the parameters
  if (!master_src && explicit_state) {
    init.resize(static_cast<size_t>(n_state_));
    for (const auto& sg : segments) {
      std::memcpy(init.data() + sg.state, host_->params().f32() + sg.begin, static_cast<size_t>(sg.end - sg.begin) * 4);
    }
    master_src = init.data();
  }
  master_ = explicit_state ? device_zeros<float>(static_cast<size_t>(n_gpu)) : model_->master();
  if (explicit_state) {
    MT_CUDA_CHECK(cudaMemcpy(master_, master_src + n_offloaded_, gpu_bytes, cudaMemcpyHostToDevice));
  } else if (master_src) {
    MT_CUDA_CHECK(cudaMemcpyAsync(master_, master_src, gpu_bytes, cudaMemcpyHostToDevice, stream_));
    model_->refresh_working();
  }
  // Adam's moments: fp32, or bf16 where --exp-avg-dtype / --exp-avg-sq-dtype asks (the loaded values are bf16's already:
  // the host optimizer rounded them at the load).
  const bool m_bf16 = exp_avg_in_bf16(cfg), v_bf16 = exp_avg_sq_in_bf16(cfg);
  if (m_bf16) m16_ = device_zeros<cuda::bf16>(static_cast<size_t>(n_gpu));
  else m_ = device_zeros<float>(static_cast<size_t>(n_gpu));
  if (v_bf16) v16_ = device_zeros<cuda::bf16>(static_cast<size_t>(n_gpu));
  else v_ = device_zeros<float>(static_cast<size_t>(n_gpu));
  st_ = device_zeros<cuda::StepState>(1);
  partials_ = device_zeros<float>(cuda::kNormPartials);
  if (loaded_) {
    if (m_bf16) cuda::moment_to_device(m16_, host_opt_->exp_avg() + n_offloaded_, n_gpu);
    else MT_CUDA_CHECK(cudaMemcpyAsync(m_, host_opt_->exp_avg() + n_offloaded_, gpu_bytes, cudaMemcpyHostToDevice, stream_));
    if (v_bf16) cuda::moment_to_device(v16_, host_opt_->exp_avg_sq() + n_offloaded_, n_gpu);
    else MT_CUDA_CHECK(cudaMemcpyAsync(v_, host_opt_->exp_avg_sq() + n_offloaded_, gpu_bytes, cudaMemcpyHostToDevice, stream_));
  }
  if (offloading_) {
    // The offloaded state: in the host optimizer's own arrays where this rank keeps them for checkpoints (no
    // second copy), else in offload_state_.
    float *w = nullptr, *m = nullptr, *v = nullptr;
    if (keep_host_ && host_opt_->master()) {
      w = host_opt_->master();
      m = host_opt_->exp_avg();
      v = host_opt_->exp_avg_sq();
      if (!loaded_) {
        std::fill(m, m + n_offloaded_, 0.0f);
        std::fill(v, v + n_offloaded_, 0.0f);
      }
    } else {
      const auto n = static_cast<size_t>(n_offloaded_);
      offload_state_.assign(3 * n, 0.0f);
      w = offload_state_.data();
      m = w + n;
      v = m + n;
      std::memcpy(w, master_src, n * 4);
      if (loaded_) {
        std::memcpy(m, host_opt_->exp_avg(), n * 4);
        std::memcpy(v, host_opt_->exp_avg_sq(), n * 4);
      }
    }
    offload_ = std::make_unique<OffloadedAdam>(host_chunks, w, m, v, offload_threads());
  }
  {
    cuda::StepState init_state{};
    init_state.t = loaded_ ? static_cast<int32_t>(host_opt_->iterations()) : 0;
    init_state.skipped_total = static_cast<int32_t>(resumed_.skipped);
    init_state.nan_total = static_cast<int32_t>(resumed_.nan_iterations);
    // fp16: the loss scaler continues on the device from its initial or checkpointed state.
    const LossScaler::State sc = scaler_.state();
    init_state.loss_scale = sc.scale;
    init_state.hysteresis_left = static_cast<int32_t>(sc.hysteresis_left);
    init_state.clean_steps = static_cast<int32_t>(sc.clean_steps);
    MT_CUDA_CHECK(cudaMemcpy(st_, &init_state, sizeof(init_state), cudaMemcpyHostToDevice));
    last_ = init_state;
  }
  scale_rule_.fp16 = cfg.precision.fp16;
  scale_rule_.dynamic = cfg.precision.fp16 && !cfg.precision.loss_scale;
  scale_rule_.min_scale = static_cast<float>(cfg.precision.min_loss_scale);
  scale_rule_.window = static_cast<int32_t>(std::min<int64_t>(cfg.precision.loss_scale_window, INT32_MAX));
  scale_rule_.hysteresis = static_cast<int32_t>(cfg.precision.hysteresis);
  if (cfg.precision.fp16) {
    for (CudaGPT* m : chunks_models_) m->set_loss_scale(&st_->loss_scale);
  }
  MT_CUDA_CHECK(cudaDeviceSynchronize());  // setup copies (some from pageable memory) done before the first step
  d_chunks_ = device_zeros<cuda::AdamChunk>(chunks_.size());
  MT_CUDA_CHECK(cudaMemcpy(d_chunks_, chunks_.data(), chunks_.size() * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  if (offloading_) {
    d_gpu_chunks_ = device_zeros<cuda::AdamChunk>(gpu_chunks_.size());
    MT_CUDA_CHECK(cudaMemcpy(d_gpu_chunks_, gpu_chunks_.data(), gpu_chunks_.size() * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  } else {
    d_gpu_chunks_ = d_chunks_;
  }
}

// Each rank's share of the data-parallel gradient sum: in bf16 / fp32 the reductions sum (NCCL's symmetric
// kernels have no average), so the backward scales by 1 / DP; fp16 keeps the average (DeviceDataParallel).
void CudaEngine::setup_data_parallel() {
#ifdef MEGATRAIN_HAVE_NCCL
  const Config& cfg = cfg_;
  if (dp_ <= 1) return;
  // MoE: the experts' gradients in a set of buckets of their own, reduced after the backward, not overlapped (they lie
  // after every dense parameter, so the layers' readiness, which the overlap keys on, does not cover them), and
  // summed over expert-DP: the DP group itself without expert parallelism (its communicator, so the two sets of buckets
  // are ordered on one stream), DP / EP ranks with it (none at expert-DP 1: each rank's experts are its own, whole). Both
  // are scaled by 1 / DP in the backward (Megatron's expert gradient scaling, as the CPU engine's).
  const bool experts = host_->has_experts();
  std::shared_ptr<NcclCommunicator> expert_comm;
  if (experts && groups_.expert_dp->size() > 1) {
    if (groups_.expert_dp == groups_.dp_cp) {  // (the same group: no EP, expert-TP = TP)
      expert_comm = dp_nccl_;
    } else {
      expert_dp_nccl_ = std::dynamic_pointer_cast<NcclCommunicator>(groups_.expert_dp);
      if (!expert_dp_nccl_) throw std::logic_error("CUDA engine: the experts' data-parallel group is not an NCCL communicator");
      expert_comm = expert_dp_nccl_;
    }
  }
  const bool bf16_wire = cfg.precision.grad_reduce_in_bf16, prescaled = !cfg.precision.fp16;
  if (dist_opt_) {
    // (highest first, as DeviceDataParallel takes them)
    std::vector<DeviceBucket> buckets, expert_buckets;
    if (expert_layout_) {
      for (const auto& b : expert_layout_->buckets()) expert_buckets.push_back({b.begin, b.end, b.shard_counts, b.shard_begin, b.shard_end});
    }
    if (expert_comm && !expert_buckets.empty()) {
      expert_ddp_ = std::make_unique<DeviceDataParallel>(expert_comm, model_->grads(), std::move(expert_buckets), false, bf16_wire, prescaled, stream_);
    }
    for (const auto& b : shard_layout_->buckets()) buckets.push_back({b.begin, b.end, b.shard_counts, b.shard_begin, b.shard_end});
    ddp_ = std::make_unique<DeviceDataParallel>(dp_nccl_, model_->grads(), std::move(buckets), cfg.training.overlap_grad_reduce, bf16_wire, prescaled,
                                                stream_);
  } else {
    // (without the distributed optimizer: every gradient all-reduced; MoE's experts apart, above the dense ones)
    const int64_t bucket = cfg.training.ddp_bucket_size.value_or(40000000);
    const auto expert_range = host_->group_range(GradGroup::kExpert);
    const int64_t dense_end = experts ? expert_range.first : P_;
    if (experts) {
      if (!expert_comm) throw std::logic_error("CUDA engine: MoE with data parallelism and without the distributed optimizer needs expert-DP > 1");
      expert_ddp_ = std::make_unique<DeviceDataParallel>(expert_comm, model_->grads(), expert_range.first, expert_range.second, bucket, false, bf16_wire,
                                                         prescaled, stream_);
    }
    ddp_ = std::make_unique<DeviceDataParallel>(dp_nccl_, model_->grads(), 0, dense_end, bucket, cfg.training.overlap_grad_reduce, bf16_wire, prescaled,
                                                stream_);
  }
  for (CudaGPT* m : chunks_models_) m->set_grads_ready_hook([this](int64_t lowest) { ddp_->on_grads_ready(lowest); });
  grad_share_ = ddp_->grad_share();
  if (!overlap_gather_) return;
  for (CudaGPT* m : chunks_models_) m->set_params_needed_hook([this](int64_t end) { ddp_->wait_params(end); });
  // (MoE: the experts' chunks, after every dense one, are updated and gathered after the backward, not overlapped)
  int64_t covered = 0;
  if (experts) {
    const int64_t expert_lo = host_->group_range(GradGroup::kExpert).first;
    const auto first = std::find_if(gpu_chunks_.begin(), gpu_chunks_.end(), [&](const cuda::AdamChunk& c) { return c.start >= expert_lo; });
    expert_chunks_ = {first - gpu_chunks_.begin(), static_cast<int64_t>(gpu_chunks_.size())};
    covered += expert_chunks_.second - expert_chunks_.first;
  }
  for (const DeviceBucket& b : ddp_->bucket_list()) {
    const auto in = [&](const cuda::AdamChunk& c) { return c.start >= b.lo && c.start < b.hi; };
    const auto first = std::find_if(gpu_chunks_.begin(), gpu_chunks_.end(), in);
    const auto last = std::find_if_not(first, gpu_chunks_.end(), in);
    bucket_chunks_[b.lo] = {first - gpu_chunks_.begin(), last - gpu_chunks_.begin()};
    covered += last - first;
  }
  if (covered != static_cast<int64_t>(gpu_chunks_.size())) throw std::logic_error("CUDA engine: the optimizer chunks do not fall into the gather buckets");
#else
  if (dp_ > 1) throw std::logic_error("CUDA engine: data parallelism needs NCCL");
#endif
}

std::vector<std::string> CudaEngine::describe() const {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const auto& cfg = cfg_;
  std::ostringstream line;
  line << "CUDA engine on " << gpu_name_ << ": " << P_ << " parameters; memory: fp32 grads + master + Adam "
       << static_cast<double>(P_ * 4 + (n_state_ - n_offloaded_) * (4 + (m16_ ? 2 : 4) + (v16_ ? 2 : 4))) / gib << " GiB"
       << (m16_ || v16_ ? " (Adam's moments " + std::string(m16_ ? "bf16" : "fp32") + " / " + (v16_ ? "bf16" : "fp32") + ")" : std::string()) << (dist_opt_ ? " (optimizer state sharded over DP)" : "");
  if (offload_) {
    line << " (master + Adam of " << n_offloaded_ << " of " << n_state_ << " state elements, " << static_cast<double>(n_offloaded_ * 12) / gib
         << " GiB, on the CPU: " << offload_->threads() << " threads)";
  }
  line << ", bf16 weights "
       << static_cast<double>(P_) * 2 / gib << " GiB, activations " << activation_gib() << " GiB"
       << (cfg.recompute.recompute_granularity ? " (recompute " + *cfg.recompute.recompute_granularity + ")" : std::string());
#ifdef MEGATRAIN_HAVE_NCCL
  // The NCCL windows hold some of the above; this is what they took of the device, rounding included.
  const size_t win = (tp_nccl_ ? tp_nccl_->window_device_bytes() : 0) + (dp_nccl_ ? dp_nccl_->window_device_bytes() : 0);
  if (win > 0) line << "; NCCL windows took " << static_cast<double>(win) / gib << " GiB of the device";
#endif
  std::vector<std::string> lines{line.str()};
  if (model_->split_layers()) {
    lines.push_back(std::string("tensor-parallel layers split in two halves of the micro batch, each half's reductions") +
                    (!cfg.parallel.sequence_parallel ? " (all-reduce, norm)"
                     : model_->split_all_to_all() ? " (all-to-all, norm adding the partial sums, all-gather; MEGATRAIN_TP_SP_ALLTOALL=0: a reduce-scatter)"
                                                  : " (reduce-scatter, norm, all-gather)") +
                    " beside the other half's compute (MEGATRAIN_TP_SPLIT_FORWARD=0: off)");
  }
  return lines;
}

DeviceMemory CudaEngine::device_memory(int64_t iteration) {
  size_t free_b = 0, total_b = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  used_peak_ = std::max(used_peak_, static_cast<double>(total_b - free_b));
  // torch's allocated and reserved memory, here: device_malloc's buffers, the NCCL windows and the caching
  // allocator's blocks (in use, and in use or cached).
  const AllocatorStats a = DeviceAllocator::instance().stats();
  size_t windows = 0;
#ifdef MEGATRAIN_HAVE_NCCL
  windows = (tp_nccl_ ? tp_nccl_->window_device_bytes() : 0) + (dp_nccl_ ? dp_nccl_->window_device_bytes() : 0);
#endif
  DeviceMemory m;
  m.allocated = static_cast<double>(a.long_lived_bytes + a.in_use_bytes + windows);
  m.max_allocated = static_cast<double>(a.peak_allocated_bytes + windows);
  m.reserved = static_cast<double>(a.long_lived_bytes + a.in_use_bytes + a.cached_bytes + windows);
  m.allocations = static_cast<double>(a.live_allocations);
  if (!memory_reported_ && groups_.dp_cp->rank() == 0) {  // Megatron's report_memory() line, and what the device says
    const auto mb = [](double b) { return b / (1024.0 * 1024.0); };
    char line[512];
    std::snprintf(line, sizeof(line),
                  "[Rank %d] (after %lld iterations) memory (MB) | allocated: %.1f | max allocated: %.1f | reserved: %.1f | max reserved: %.1f | "
                  "device used: %.1f of %.1f\n",
                  groups_.world->rank(), static_cast<long long>(iteration), mb(m.allocated), mb(m.max_allocated), mb(m.reserved),
                  mb(static_cast<double>(a.peak_reserved_bytes + windows)), mb(static_cast<double>(total_b - free_b)), mb(static_cast<double>(total_b)));
    std::cout << line << std::flush;
  }
  memory_reported_ = true;
  // The log line's figures, the most of any rank: megatrain's allocations in use and their peak, the device's peak.
  float most[3] = {static_cast<float>(m.allocated), static_cast<float>(m.max_allocated), static_cast<float>(used_peak_)};
  if (groups_.world->size() > 1) {
    // Ordered before the all-reduce (which runs on the communicator's own stream): on the training stream, waited for.
    MT_CUDA_CHECK(cudaMemcpyAsync(avg_buf_, most, sizeof(most), cudaMemcpyHostToDevice, stream_));
    wait_stream();
    groups_.world->all_reduce(avg_buf_, 3, ReduceOp::kMax);
    MT_CUDA_CHECK(cudaMemcpy(most, avg_buf_, sizeof(most), cudaMemcpyDeviceToHost));
  }
  m.in_use_most = static_cast<double>(most[0]);
  m.max_allocated_most = static_cast<double>(most[1]);
  m.peak_used = static_cast<double>(most[2]);
  return m;
}

CudaEngine::~CudaEngine() {
  if (drained_) cudaEventDestroy(drained_);
  if (dist_opt_ || offloading_) device_free(master_);  // else the model's
  for (void* p : {static_cast<void*>(m_), static_cast<void*>(v_), static_cast<void*>(m16_), static_cast<void*>(v16_), static_cast<void*>(st_), static_cast<void*>(partials_), static_cast<void*>(d_chunks_),
                  static_cast<void*>(d_gpu_chunks_ != d_chunks_ ? d_gpu_chunks_ : nullptr),
                  static_cast<void*>(eval_acc_), static_cast<void*>(avg_buf_), static_cast<void*>(loss_hist_), static_cast<void*>(norm_hist_),
                  static_cast<void*>(skip_hist_), static_cast<void*>(moe_hist_), static_cast<void*>(zeros_hist_)}) {
    device_free(p);
  }
}

bool CudaEngine::any_rank(bool mine) {
  if (groups_.world->size() == 1) return mine;
  float v = mine ? 1.0f : 0.0f;
  auto* flag = static_cast<float*>(DeviceAllocator::instance().allocate(sizeof(float)));
  MT_CUDA_CHECK(cudaMemcpy(flag, &v, sizeof(float), cudaMemcpyHostToDevice));
  MT_CUDA_CHECK(cudaDeviceSynchronize());  // (a pageable copy may still be in flight; NCCL's stream does not wait for it)
  groups_.world->all_reduce(flag, 1, ReduceOp::kMax);  // (NCCL's: waits for its stream)
  MT_CUDA_CHECK(cudaMemcpy(&v, flag, sizeof(float), cudaMemcpyDeviceToHost));
  DeviceAllocator::instance().release(flag);
  return v > 0;
}

}  // namespace mt
