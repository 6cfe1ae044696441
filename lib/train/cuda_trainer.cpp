// cuda_trainer.cpp: microbatches are staged in pinned host buffers (two sets, alternating iterations; an
// event guards reuse) and copied asynchronously; forward/backward, the gradient norm, the skip decision
// and AdamW are queued on the training stream (collectives on NCCL's streams, ordered by events); the host
// synchronises only to log, validate or save.
#include "train/cuda_trainer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/token_source.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/optimizer_step.h"
#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "optim/batch_schedule.h"
#include "optim/data_parallel.h"
#include "optim/loss_scaler.h"
#ifdef MEGATRAIN_HAVE_NCCL
#include "optim/cuda/device_data_parallel.h"
#endif
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "pipeline/cuda_stage.h"
#include "pipeline/schedule.h"
#include "plan/flops.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/cuda/op_profiler.h"
#include "tensor/device_info.h"
#include "tensor/dtype.h"
#include "train/log_line.h"
#include "train/train_common.h"
#include "train/microbatch_staging.h"

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;

double peak_tflops(const std::string& gpu) {
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


TrainResult train_cuda(const Config& cfg, ProcessGroups groups, const TrainOptions& opt) {
  const bool lead = opt.rank == 0 && !opt.quiet;
  auto src = open_training_data(cfg);
  cudaStream_t stream = nullptr;
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const auto gpus = visible_gpus();
  const std::string gpu_name = gpus.empty() ? std::string("GPU") : gpus.front().name;
  const double peak = peak_tflops(gpu_name);

  // The host parameters: the layout both engines build, with the initial values (the same as the CPU engine's);
  // with checkpoints they stay as the host side of save / load, otherwise they are dropped after upload.
  const auto& ck = cfg.checkpoint;
  auto host = std::make_unique<ParamStore>();
  const ModelLayout where = build_model_layout(cfg, {groups.tp->rank(), groups.tp->size(), groups.pp->rank(), groups.pp->size()}, *host);
  host->release_grads();  // the gradients live on the device
  const int64_t dp = groups.dp_cp->size(), dp_rank = groups.dp_cp->rank();
  // The distributed optimizer (ZeRO-1): this DP rank keeps the master weights and Adam moments of its
  // blocks of the CPU engine's gradient buckets only (the same split, so checkpoints and the host optimizer
  // line up); the optimizer state lies back to back in segment order (Optimizer::make_segments).
  const bool dist_opt = cfg.training.use_distributed_optimizer && dp > 1;
  const bool overlap_gather = dist_opt && cfg.training.overlap_param_gather;
  std::unique_ptr<DataParallel> shard_layout;
  FlatRanges owned{{0, host->numel()}};
  if (dist_opt) {
    shard_layout = std::make_unique<DataParallel>(cfg, *host, groups.dp_cp);
    owned = shard_layout->owned_ranges();
  }
  const std::vector<Optimizer::Segment> segments = Optimizer::make_segments(*host, owned);
  const int64_t n_state = segments.empty() ? 0 : segments.back().state + (segments.back().end - segments.back().begin);
  // The host optimizer (fp32 master weights, Adam moments) exists only to load or save checkpoints.
  std::unique_ptr<Optimizer> host_opt;
  if (ck.load || ck.save) host_opt = std::make_unique<Optimizer>(cfg, *host, groups, owned, dist_opt);
  LossScaler scaler(cfg);
  TrainState state;
  bool loaded = false;
  if (ck.load && (ck.ckpt_step || latest_checkpoint(*ck.load))) {
    const LoadOptions lo = load_options(cfg);
    state = load_checkpoint(*ck.load, lo, *host, *host_opt, scaler);
    loaded = lo.load_optimizer;
    if (lead) {
      std::cout << "megatrain: loaded " << checkpoint_path(*ck.load, ck.ckpt_step.value_or(*latest_checkpoint(*ck.load)))
                << ": continuing after iteration " << state.iteration << "\n";
    }
  } else if (ck.load && lead) {
    std::cout << "megatrain: no checkpoint in " << *ck.load << " yet: starting from scratch\n";
  }
  const ParamStore& layout = *host;
  const int64_t P = layout.numel();
  // Without the distributed optimizer one rank owns every range: the state is laid out like the parameters.
  for (const auto& sg : segments) {
    if (!dist_opt && sg.state != sg.begin) throw std::logic_error("CUDA trainer: optimizer state not aligned with the parameters");
  }
  // Tensor parallelism: the model queues its collectives on the training stream through the TP group.
  StreamCollectives* tp_coll = nullptr;
#ifdef MEGATRAIN_HAVE_NCCL
  std::shared_ptr<NcclCommunicator> tp_nccl;
  if (groups.tp->size() > 1) {
    tp_nccl = std::dynamic_pointer_cast<NcclCommunicator>(groups.tp);
    if (!tp_nccl) throw std::logic_error("CUDA trainer: the tensor-parallel group is not an NCCL communicator");
    tp_coll = tp_nccl.get();
  }
  // Data parallelism: the gradient (and, with the distributed optimizer, 16-bit weight) buffers go into the DP
  // group's symmetric windows, which the communicator owns: it is declared before the model so that it
  // outlives it (the model keeps raw pointers into the windows).
  std::shared_ptr<NcclCommunicator> dp_nccl;
  if (dp > 1) {
    dp_nccl = std::dynamic_pointer_cast<NcclCommunicator>(groups.dp_cp);
    if (!dp_nccl) throw std::logic_error("CUDA trainer: the data-parallel group is not an NCCL communicator");
  }
  StreamCollectives* dp_coll = dp_nccl.get();
#else
  if (groups.tp->size() > 1) throw std::logic_error("CUDA trainer: tensor parallelism needs NCCL");
  StreamCollectives* dp_coll = nullptr;
#endif
  const int64_t tp = groups.tp->size();
  // Master weights: the model's full buffer, or this rank's shard of them (distributed optimizer), filled
  // from the host optimizer's copy when there is one (loaded, or initialised from the parameters) and else
  // from the layout's parameters, still the unrounded initial values.
  CudaGPT model(cfg, layout, where, stream, tp_coll, /*keep_master=*/!dist_opt, dp_coll);
  float* master = dist_opt ? device_zeros<float>(static_cast<size_t>(n_state)) : model.master();
  const size_t state_bytes = static_cast<size_t>(n_state) * 4;
  if (host_opt && host_opt->master()) {
    MT_CUDA_CHECK(cudaMemcpyAsync(master, host_opt->master(), state_bytes, cudaMemcpyHostToDevice, stream));
    if (!dist_opt) model.refresh_working();
  } else if (dist_opt) {
    std::vector<float> init(static_cast<size_t>(n_state));
    for (const auto& sg : segments) {
      std::memcpy(init.data() + sg.state, layout.params().f32() + sg.begin, static_cast<size_t>(sg.end - sg.begin) * 4);
    }
    MT_CUDA_CHECK(cudaMemcpy(master, init.data(), state_bytes, cudaMemcpyHostToDevice));
  }
  float* m = device_zeros<float>(static_cast<size_t>(n_state));
  float* v = device_zeros<float>(static_cast<size_t>(n_state));
  auto* st = device_zeros<cuda::StepState>(1);
  float* partials = device_zeros<float>(cuda::kNormPartials);
  if (loaded) {
    MT_CUDA_CHECK(cudaMemcpyAsync(m, host_opt->exp_avg(), state_bytes, cudaMemcpyHostToDevice, stream));
    MT_CUDA_CHECK(cudaMemcpyAsync(v, host_opt->exp_avg_sq(), state_bytes, cudaMemcpyHostToDevice, stream));
  }
  {
    cuda::StepState init{};
    init.t = loaded ? static_cast<int32_t>(host_opt->iterations()) : 0;
    init.skipped_total = static_cast<int32_t>(state.skipped);
    init.nan_total = static_cast<int32_t>(state.nan_iterations);
    // fp16: the loss scaler continues on the device from its initial or checkpointed state.
    const LossScaler::State sc = scaler.state();
    init.loss_scale = sc.scale;
    init.hysteresis_left = static_cast<int32_t>(sc.hysteresis_left);
    init.clean_steps = static_cast<int32_t>(sc.clean_steps);
    MT_CUDA_CHECK(cudaMemcpy(st, &init, sizeof(init), cudaMemcpyHostToDevice));
  }
  cuda::LossScaleRule scale_rule;
  scale_rule.fp16 = cfg.precision.fp16;
  scale_rule.dynamic = cfg.precision.fp16 && !cfg.precision.loss_scale;
  scale_rule.min_scale = static_cast<float>(cfg.precision.min_loss_scale);
  scale_rule.window = static_cast<int32_t>(std::min<int64_t>(cfg.precision.loss_scale_window, INT32_MAX));
  scale_rule.hysteresis = static_cast<int32_t>(cfg.precision.hysteresis);
  if (cfg.precision.fp16) model.set_loss_scale(&st->loss_scale);
  MT_CUDA_CHECK(cudaDeviceSynchronize());  // setup copies (some from pageable memory) done before the first step
  // The multi-tensor table: chunks of at most 64 Ki elements of the owned segments, each inside one
  // parameter. A parameter n TP ranks hold (norms, row-parallel biases and positions: all TP ranks; a
  // K/V-replicated QKV shard: its group's ranks) counts 1/n in each rank's norm partials, which are then
  // summed over TP (and over DP with the distributed optimizer): every parameter once.
  std::vector<cuda::AdamChunk> chunks;
  for (const auto& sg : segments) {
    const ParamInfo& p = layout.info(sg.param);
    // Held by tp / shard_count ranks: whole (shard_dim < 0) or a K/V-replicated shard.
    const int64_t holders = p.shard_dim < 0 ? tp : tp / std::max<int64_t>(1, p.shard_count);
    const float nw = 1.0f / static_cast<float>(std::max<int64_t>(1, holders));
    for (int64_t o = 0; o < sg.end - sg.begin; o += 65536) {
      chunks.push_back({sg.begin + o, static_cast<int32_t>(std::min<int64_t>(65536, sg.end - sg.begin - o)), p.weight_decay ? 1 : 0, nw,
                        dist_opt ? sg.state + o : -1});
    }
  }
  // In flat order, so each data-parallel bucket's chunks are one run of the table (the overlapped parameter
  // gather updates and sends the model bucket by bucket, lowest first).
  std::stable_sort(chunks.begin(), chunks.end(), [](const cuda::AdamChunk& a, const cuda::AdamChunk& b) { return a.start < b.start; });
  const auto n_chunks = static_cast<int64_t>(chunks.size());
  cuda::AdamChunk* d_chunks = device_zeros<cuda::AdamChunk>(chunks.size());
  MT_CUDA_CHECK(cudaMemcpy(d_chunks, chunks.data(), chunks.size() * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  // Each rank's share of the data-parallel gradient sum: in bf16 / fp32 the reductions sum (NCCL's symmetric
  // kernels have no average), so the backward scales by 1 / DP; fp16 keeps the average (DeviceDataParallel).
  float grad_share = 1.0f;
#ifdef MEGATRAIN_HAVE_NCCL
  std::unique_ptr<DeviceDataParallel> ddp;
  if (dp > 1) {
    if (dist_opt) {
      std::vector<DeviceBucket> buckets;
      for (const auto& b : shard_layout->buckets()) buckets.push_back({b.begin, b.end, b.shard_counts, b.shard_begin, b.shard_end});
      ddp = std::make_unique<DeviceDataParallel>(dp_nccl, model.grads(), P, std::move(buckets), cfg.training.overlap_grad_reduce,
                                                 cfg.precision.grad_reduce_in_bf16, !cfg.precision.fp16, stream);
    } else {
      const int64_t bucket = cfg.training.ddp_bucket_size.value_or(40000000);
      ddp = std::make_unique<DeviceDataParallel>(dp_nccl, model.grads(), P, bucket, cfg.training.overlap_grad_reduce,
                                                 cfg.precision.grad_reduce_in_bf16, !cfg.precision.fp16, stream);
    }
    model.set_grads_ready_hook([&ddp](int64_t lowest) { ddp->on_grads_ready(lowest); });
    grad_share = ddp->grad_share();
    if (overlap_gather) model.set_params_needed_hook([&ddp](int64_t end) { ddp->wait_params(end); });
  }
  // --overlap-param-gather: the chunks [first, second) of the table that update the bucket starting at lo.
  std::map<int64_t, std::pair<int64_t, int64_t>> bucket_chunks;
  if (overlap_gather) {
    int64_t covered = 0;
    for (const DeviceBucket& b : ddp->bucket_list()) {
      const auto in = [&](const cuda::AdamChunk& c) { return c.start >= b.lo && c.start < b.hi; };
      const auto first = std::find_if(chunks.begin(), chunks.end(), in);
      const auto last = std::find_if_not(first, chunks.end(), in);
      bucket_chunks[b.lo] = {first - chunks.begin(), last - chunks.begin()};
      covered += last - first;
    }
    if (covered != n_chunks) throw std::logic_error("CUDA trainer: the optimizer chunks do not fall into the gather buckets");
  }
#else
  if (dp > 1) throw std::logic_error("CUDA trainer: data parallelism needs NCCL");
#endif
  // partials[kNormPartials] = the norm partial sums of x (gradients, indexed like the parameters, or master
  // weights, indexed like the optimizer state), summed over TP, and over DP when each rank owns a shard.
  // With the distributed optimizer a rank's own non-finite loss poisons the gradient partials, so every rank
  // skips the step together (each updates only its shard: one skipping alone would split the model).
  auto norm_partials = [&](const float* x, bool by_state, const float* loss = nullptr) {
    cuda::sumsq_partials(partials, x, d_chunks, n_chunks, by_state, stream);
    if (loss && dist_opt) cuda::poison_if_nonfinite(partials, loss, stream);
#ifdef MEGATRAIN_HAVE_NCCL
    if (tp_nccl) tp_nccl->all_reduce_on(partials, cuda::kNormPartials, WireType::kF32, ReduceOp::kSum, stream);
    if (dist_opt) dp_nccl->all_reduce_on(partials, cuda::kNormPartials, WireType::kF32, ReduceOp::kSum, stream);
#endif
  };
  // Data-parallel rank 0 writes the parameters; the optimizer state is written by rank 0 (every replica
  // holds the same) or, with the distributed optimizer, by every rank for its shard. Ranks that write keep
  // the host model and optimizer after the upload; the others take part in the save with an empty shard.
  const bool keep_host = ck.save.has_value() && (dp_rank == 0 || dist_opt);
  shard_layout.reset();  // refers to the host model's parameters; its buckets were copied
  if (!keep_host) {
    host_opt.reset();
    host.reset();
  }

  LrSchedule schedule(cfg);
  const ModelDims& D = model.dims();
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const int64_t nmb = cfg.derived.num_microbatches, gbs = cfg.derived.global_batch_size;
  // The batch of each iteration (fixed, or ramped up by --rampup-batch-size) and the run's length: what the
  // ramp needs to reach --train-samples from the samples consumed so far.
  const BatchSchedule batches(cfg, dp);
  const int64_t nmb_max = batches.max_global_batch() / (mbs * dp);
  const int64_t iters = cfg.training.train_iters ? *cfg.training.train_iters
                                                  : batches.train_iterations(*cfg.training.train_samples);
  const double flops_full_batch = flops_per_iteration(cfg);
  auto flops_of = [&](int64_t batch) { return flops_full_batch * static_cast<double>(batch) / static_cast<double>(gbs); };
  const int64_t world = groups.world->size();
  const bool has_valid = src->has_split(Split::kValid) && cfg.logging.eval_iters > 0;
  const float clip = static_cast<float>(cfg.training.clip_grad);
  const float b1 = static_cast<float>(cfg.training.adam_beta1), b2 = static_cast<float>(cfg.training.adam_beta2);
  const float eps = static_cast<float>(cfg.training.adam_eps), wd = static_cast<float>(cfg.training.weight_decay);

  MetricsFile metrics(cfg, opt.rank, groups.world->size());
  if (lead) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::cout << "megatrain: data: " << src->describe() << "\n";
    std::cout << "megatrain: CUDA engine on " << gpu_name << ": " << P << " parameters; memory: fp32 grads + master + Adam "
              << static_cast<double>(P * 4 + n_state * 12) / gib << " GiB" << (dist_opt ? " (optimizer state sharded over DP)" : "")
              << ", bf16 weights " << static_cast<double>(P) * 2 / gib << " GiB, activations "
              << static_cast<double>(model.activation_bytes()) / gib << " GiB"
              << (cfg.recompute.recompute_granularity ? " (recompute " + *cfg.recompute.recompute_granularity + ")" : std::string());
#ifdef MEGATRAIN_HAVE_NCCL
    // The NCCL windows hold some of the above; this is what they took of the device, rounding included.
    const size_t win = (tp_nccl ? tp_nccl->window_device_bytes() : 0) + (dp_nccl ? dp_nccl->window_device_bytes() : 0);
    if (win > 0) std::cout << "; NCCL windows took " << static_cast<double>(win) / gib << " GiB of the device";
#endif
    std::cout << "\n";
    if (model.split_layers()) {
      std::cout << "megatrain: tensor-parallel layers split in two halves of the micro batch, each half's reductions"
                << (!cfg.parallel.sequence_parallel ? " (all-reduce, norm)"
                    : model.split_all_to_all() ? " (all-to-all, norm adding the partial sums, all-gather; MEGATRAIN_TP_SP_ALLTOALL=0: a reduce-scatter)"
                                               : " (reduce-scatter, norm, all-gather)")
                << " beside the other half's compute (MEGATRAIN_TP_SPLIT_FORWARD=0: off)\n";
    }
    std::cout << "megatrain: training " << iters << " iterations of " << gbs << " samples x " << S << " tokens (" << nmb
              << " microbatches of " << mbs << (batches.ramping() ? ", the batch ramped up from " + cfg.training.rampup_batch_size[0] : std::string())
              << ")\n"
              << std::flush;
  }

  std::vector<std::unique_ptr<MicrobatchSlot>> slots;
  // Hidden dropout: each training micro batch carries its samples' mask keys (dropout_key: the embedding,
  // then per layer the attention block's and the MLP's output), the CPU engine's masks.
  const bool hidden_dropout = cfg.model.hidden_dropout > 0;
  const int64_t key_sites = 1 + 2 * D.L;
  for (int64_t i = 0; i < 2 * nmb_max; ++i) slots.push_back(std::make_unique<MicrobatchSlot>(mbs * S, hidden_dropout ? mbs * key_sites : 0));
  std::vector<uint64_t> drop_keys;
  auto make_drop_keys = [&](const Microbatch& mb, int64_t step) {
    drop_keys.clear();
    if (!hidden_dropout) return;
    const auto seed = static_cast<uint64_t>(cfg.training.seed);
    for (int64_t b = 0; b < mb.B; ++b) {
      drop_keys.push_back(dropout_key(seed, step, mb.first_sample + b, -1, kDropEmbedding));
      for (int64_t l = 0; l < D.L; ++l) {
        drop_keys.push_back(dropout_key(seed, step, mb.first_sample + b, l, kDropAttnOut));
        drop_keys.push_back(dropout_key(seed, step, mb.first_sample + b, l, kDropMlpOut));
      }
    }
  };
  MicrobatchSlot eval_slot(mbs * S);
  float* eval_acc = device_zeros<float>(1);

  TrainResult res;
  res.skipped = state.skipped;
  res.nan_iterations = state.nan_iterations;
  std::unique_ptr<CheckpointSaver> saver;
  if (ck.save) saver = make_saver(cfg, groups);
  int64_t consumed = state.consumed_samples;  // samples consumed by the iterations queued so far
  double flops_done = state.flops_so_far;
  int64_t interval_samples = 0;
  const int64_t first_iter = state.iteration + 1;
  std::vector<int64_t> pending_iters;  // iterations whose loss has not been read yet
  std::vector<double> pending_lr;
  float* loss_hist = device_zeros<float>(static_cast<size_t>(cfg.logging.log_interval) + 1);
  float* norm_hist = device_zeros<float>(static_cast<size_t>(cfg.logging.log_interval) + 1);
  auto* skip_hist = device_zeros<int32_t>(static_cast<size_t>(cfg.logging.log_interval) + 1);

  // Averages host values over the data-parallel group (log and validation time only): through the NCCL
  // group on a small device buffer, so torchrun-style launches without MPI work too.
  float* avg_buf = device_zeros<float>(static_cast<size_t>(cfg.logging.log_interval) + 1);
  auto dp_average = [&](float* values, int64_t n) {
    MT_CUDA_CHECK(cudaMemcpy(avg_buf, values, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
    MT_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may still be in flight; NCCL's stream is not ordered with it
    groups.dp_cp->all_reduce(avg_buf, n, ReduceOp::kAvg);
    MT_CUDA_CHECK(cudaMemcpy(values, avg_buf, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost));
  };
  // Every host wait on the device goes through here: with data or tensor parallelism it polls an NCCL
  // communicator, so a dead peer ends the job after --distributed-timeout-seconds instead of hanging it.
  const std::function<void(cudaEvent_t)> wait_event = [&](cudaEvent_t ev) {
#ifdef MEGATRAIN_HAVE_NCCL
    if (tp_nccl) {
      tp_nccl->wait_event(ev, "training step");
      return;
    }
    if (ddp) {
      ddp->comm().wait_event(ev, "training step");
      return;
    }
#endif
    MT_CUDA_CHECK(cudaEventSynchronize(ev));
  };
  cudaEvent_t drained = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&drained, cudaEventDisableTiming));
  auto wait_stream = [&]() {
    MT_CUDA_CHECK(cudaEventRecord(drained, stream));
    wait_event(drained);
  };
  auto read_state = [&]() {
    cuda::StepState h{};
    wait_stream();
    MT_CUDA_CHECK(cudaMemcpy(&h, st, sizeof(h), cudaMemcpyDeviceToHost));
    return h;
  };
  // Every bucket's parameters on the compute stream (the overlapped gather is otherwise waited for by the
  // next forward): before the weights leave the device and at the end.
  auto params_gathered = [&]() {
#ifdef MEGATRAIN_HAVE_NCCL
    if (overlap_gather) ddp->wait_params(INT64_MAX);
#endif
  };
  auto save_now = [&](int64_t it) {
    params_gathered();
    const cuda::StepState h = read_state();
    if (!keep_host) {
      auto empty = std::make_unique<Snapshot>();
      empty->who.world_rank = groups.world->rank();
      empty->who.world_size = groups.world->size();
      empty->who.writes_params = empty->who.writes_optimizer = false;
      empty->state.iteration = it;
      empty->layout_json = "{}";
      saver->save(std::move(empty));
      return;
    }
    MT_CUDA_CHECK(cudaMemcpy(host_opt->master(), master, state_bytes, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(cudaMemcpy(host_opt->exp_avg(), m, state_bytes, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(cudaMemcpy(host_opt->exp_avg_sq(), v, state_bytes, cudaMemcpyDeviceToHost));
    host_opt->set_iterations(h.t);
    if (!dist_opt) {
      host_opt->refresh_working_weights();
    } else if (dp_rank == 0) {
      // This rank holds the master weights of its shard only; the working weights of every shard were gathered
      // after the step: they are the parameters to write.
      std::vector<uint16_t> w16(static_cast<size_t>(P));
      MT_CUDA_CHECK(cudaMemcpy(w16.data(), model.working(), static_cast<size_t>(P) * 2, cudaMemcpyDeviceToHost));
      float* hp = host->params().f32();
      if (cfg.precision.fp16) {
        for (int64_t i = 0; i < P; ++i) hp[i] = fp16_to_float(w16[static_cast<size_t>(i)]);
      } else {
        for (int64_t i = 0; i < P; ++i) hp[i] = bf16_to_float(w16[static_cast<size_t>(i)]);
      }
    }
    state.flops_so_far = flops_done;
    state.iteration = it;
    state.consumed_samples = consumed;
    state.skipped = h.skipped_total;
    state.nan_iterations = h.nan_total;
    state.scaler = {cfg.precision.fp16 ? h.loss_scale : 1.0f, h.hysteresis_left, h.clean_steps, scaler.dynamic()};
    CheckpointRank who;
    who.world_rank = groups.world->rank();
    who.world_size = groups.world->size();
    who.writes_params = dp_rank == 0;
    who.writes_optimizer = dp_rank == 0 || dist_opt;
    saver->save(take_snapshot(cfg, *host, *host_opt, state, who, !ck.no_save_optim));
    if (lead) std::cout << "megatrain: " << (ck.async_save ? "saving" : "saved") << " checkpoint at iteration " << it << " to " << *ck.save << "\n" << std::flush;
  };

  // MEGATRAIN_PROFILE_ITER=N: per-op device time of iteration N (printed once, by rank 0).
  const char* prof_env = std::getenv("MEGATRAIN_PROFILE_ITER");
  const int64_t profile_iter = prof_env ? std::atoll(prof_env) : -1;
  auto interval_start = Clock::now();
  double excluded_secs = 0;  // evaluation and checkpoint time inside the interval
  for (int64_t it = first_iter; it <= iters; ++it) {
    const double waited_before = MicrobatchSlot::wait_ms;
    const int64_t mallocs_before = DeviceAllocator::instance().stats().device_mallocs;
    if (it == profile_iter) OpProfiler::instance().enable(stream);
    MT_PROF("opt.zero_grads", MT_CUDA_CHECK(cudaMemsetAsync(model.grads(), 0, static_cast<size_t>(P) * 4, stream)));
    const int64_t base = consumed, batch = batches.global_batch(consumed), nmb_it = batch / (mbs * dp);
#ifdef MEGATRAIN_HAVE_NCCL
    if (ddp) ddp->start_iteration();
#endif
    // The schedule's microbatches (no pipelining): each staged on the device with its share of the loss.
    CudaPipelineStage stage(
        model,
        [&](int64_t mi) {
          const Microbatch mb = make_microbatch(*src, Split::kTrain, base + mi * mbs * dp + dp_rank * mbs, mbs, S, cfg);
          double denom = 0;
          for (float x : mb.loss_mask) denom += x;
          denom = std::max(denom, 1.0);
          MicrobatchSlot& slot = *slots[static_cast<size_t>((it % 2) * nmb_max + mi)];
          make_drop_keys(mb, it);
          const float w_mb = static_cast<float>(1.0 / (denom * static_cast<double>(nmb_it)));
          return CudaPipelineStage::Staged{
              slot.upload(mb, D.learned_pos, D.tp_rank * D.V_local, D.V_local, D.max_pos, stream, wait_event, drop_keys), w_mb * grad_share, w_mb};
        },
        &st->loss_acc);
    run_schedule(no_pipelining_schedule(nmb_it), stage);
#ifdef MEGATRAIN_HAVE_NCCL
    if (ddp) MT_PROF("dp.grad_all_reduce_wait", ddp->finish());
#endif
    consumed += batch;
    flops_done += flops_of(batch);
    interval_samples += batch;
    const double lr = schedule.lr_at_samples(base);  // as the CPU engine (train/trainer.cpp): Megatron's order
    MT_PROF("opt.grad_norm", norm_partials(model.grads(), false, &st->loss_acc));
    cuda::step_prepare(st, partials, clip, b1, b2, 1.0f, scale_rule, stream);
    auto adamw = [&](int64_t first, int64_t count) {
      MT_PROF("opt.adamw", cuda::adamw_multi(master, m, v, model.working(), model.grads(), d_chunks + first, count, st, static_cast<float>(lr), b1,
                                             b2, eps, wd, stream, model.half_type()));
    };
#ifdef MEGATRAIN_HAVE_NCCL
    // Distributed optimizer: each rank updates the working weights of its blocks; every rank gets all of them,
    // after the step or (--overlap-param-gather) bucket by bucket as the step updates them, on the
    // communicator's stream, while the rest of the step and the next forward run.
    if (overlap_gather) {
      ddp->start_param_gather(model.working(), [&](int64_t lo) {
        const auto [first, last] = bucket_chunks.at(lo);
        if (last > first) adamw(first, last - first);
      });
    } else {
      adamw(0, n_chunks);
      if (dist_opt) MT_PROF("dp.param_gather", ddp->gather_params(model.working()));
    }
#else
    adamw(0, n_chunks);
#endif
    if (it == profile_iter) {
      // The step's only possible host waits: a staging buffer still being copied (the two-iteration run-ahead
      // bound) and a cudaMalloc (an implicit device synchronisation) in the allocator. Both are reported.
      const int64_t mallocs = DeviceAllocator::instance().stats().device_mallocs - mallocs_before;
      const auto prof = OpProfiler::instance().collect();
      double total = 0;
      for (const auto& [name, ms] : prof) total += ms;
      if (lead) {
        std::printf("megatrain: profile of iteration %lld: device time in named ops %.1f ms (summed over streams); host waits inside the step: %.1f ms for "
                    "staging buffers, %lld cudaMalloc calls\n",
                    static_cast<long long>(it), total, MicrobatchSlot::wait_ms - waited_before, static_cast<long long>(mallocs));
        for (const auto& [name, ms] : prof) std::printf("  %-28s %9.2f ms %6.1f%%\n", name.c_str(), ms, 100.0 * ms / total);
        std::fflush(stdout);
      }
      // MEGATRAIN_PROFILE_TIMELINE=PREFIX: every rank writes PREFIX.rankN.csv, each region's stream, start and end
      // (ms from the start of the step): what overlapped what (side-stream GEMMs, NCCL collectives).
      if (const char* tl = std::getenv("MEGATRAIN_PROFILE_TIMELINE")) {
        const std::string path = std::string(tl) + ".rank" + std::to_string(groups.world->rank()) + ".csv";
        std::ofstream f(path);
        if (!f) throw std::runtime_error("cannot write the profile timeline " + path + ": check MEGATRAIN_PROFILE_TIMELINE");
        f << "name,stream,start_ms,end_ms\n";
        for (const auto& sp : OpProfiler::instance().timeline()) f << sp.name << "," << sp.stream << "," << sp.start_ms << "," << sp.end_ms << "\n";
      }
    }
    const size_t slot_i = pending_iters.size();
    MT_CUDA_CHECK(cudaMemcpyAsync(loss_hist + slot_i, &st->loss, 4, cudaMemcpyDeviceToDevice, stream));
    MT_CUDA_CHECK(cudaMemcpyAsync(norm_hist + slot_i, &st->grad_norm, 4, cudaMemcpyDeviceToDevice, stream));
    MT_CUDA_CHECK(cudaMemcpyAsync(skip_hist + slot_i, &st->skip, 4, cudaMemcpyDeviceToDevice, stream));
    pending_iters.push_back(it);
    pending_lr.push_back(schedule.lr_at_samples(consumed));
    res.iterations = it;

    if (it % cfg.logging.log_interval == 0 || it == iters) {
      const cuda::StepState h = read_state();
      const double secs = std::chrono::duration<double>(Clock::now() - interval_start).count() - excluded_secs;
      std::vector<float> losses(pending_iters.size()), norms(pending_iters.size());
      MT_CUDA_CHECK(cudaMemcpy(losses.data(), loss_hist, losses.size() * 4, cudaMemcpyDeviceToHost));
      MT_CUDA_CHECK(cudaMemcpy(norms.data(), norm_hist, norms.size() * 4, cudaMemcpyDeviceToHost));
      std::vector<int32_t> skips(pending_iters.size());
      MT_CUDA_CHECK(cudaMemcpy(skips.data(), skip_hist, skips.size() * 4, cudaMemcpyDeviceToHost));
      if (dp > 1) {
        dp_average(losses.data(), static_cast<int64_t>(losses.size()));
      }
      double sum = 0;
      int64_t n_ok = 0;
      for (size_t i = 0; i < losses.size(); ++i) {
        res.losses.push_back(losses[i]);
        if (std::isfinite(losses[i]) && !skips[i]) {  // as Megatron: the logged loss leaves skipped iterations out
          sum += losses[i];
          ++n_ok;
        }
      }
      res.skipped = h.skipped_total;
      res.nan_iterations = h.nan_total;
      const double n_iter = static_cast<double>(pending_iters.size());
      IterationStats s;
      s.iteration = it;
      s.train_iters = iters;
      s.consumed_samples = consumed;
      s.global_batch = batch;
      s.ms_per_iter = 1000.0 * secs / n_iter;
      s.tflops_per_gpu = flops_of(interval_samples) / secs / static_cast<double>(world) / 1e12;
      s.loss = n_ok ? sum / static_cast<double>(n_ok) : NAN;
      s.lr = pending_lr.back();
      s.grad_norm = norms.back();
      s.loss_scale = cfg.precision.fp16 ? h.loss_scale : 1.0f;
      res.loss_scale = s.loss_scale;
      s.skipped = res.skipped;
      s.nan_iters = res.nan_iterations;
      s.tokens_per_s_per_gpu = static_cast<double>(interval_samples * S) / secs / static_cast<double>(world);
      interval_samples = 0;
      s.mfu = peak > 0 ? s.tflops_per_gpu / peak : -1;
      if (cfg.logging.log_params_norm) {
        // The fp32 master weights, through the gradient-norm kernel's partial sums (the device is drained here,
        // and the next step recomputes its own partials), summed over TP and, with the distributed
        // optimizer, over the DP shards.
        norm_partials(master, true);
        std::vector<float> part(cuda::kNormPartials);
        MT_CUDA_CHECK(cudaMemcpyAsync(part.data(), partials, part.size() * 4, cudaMemcpyDeviceToHost, stream));
        wait_stream();
        double sq = 0;
        for (float x : part) sq += x;
        s.params_norm = std::sqrt(sq);
      }
      if (lead) std::cout << format_iteration_line(s) << "\n" << std::flush;
      metrics.iteration(s);
      pending_iters.clear();
      pending_lr.clear();
      // The device counts every run of non-finite steps (each one skipped); the longest is checked here.
      if (h.max_nonfinite_run >= cfg.training.exit_on_nan_count) {
        throw std::runtime_error("loss or gradient norm was not finite for " + std::to_string(h.max_nonfinite_run) +
                                 " iterations in a row (seen at the log of iteration " + std::to_string(it) +
                                 "): lower --lr, raise --lr-warmup-iters or check the data");
      }
      interval_start = Clock::now();
      excluded_secs = 0;
    }
    const bool evaluating = has_valid && (it % cfg.logging.eval_interval == 0 || it == iters);
    const bool exiting = cfg.training.exit_interval && *cfg.training.exit_interval > 0 && it % *cfg.training.exit_interval == 0;
    const bool saving = saver && (it % *ck.save_interval == 0 || it == iters || exiting);
    if (evaluating || saving) read_state();  // the queued training work counts as training time, not as side work
    const auto side_start = Clock::now();
    if (evaluating) {
      MT_CUDA_CHECK(cudaMemsetAsync(eval_acc, 0, 4, stream));
      int64_t n = 0;
      for (int64_t e = 0; e < cfg.logging.eval_iters; ++e) {
        for (int64_t mi = 0; mi < nmb; ++mi) {
          const Microbatch mb = make_microbatch(*src, Split::kValid, e * gbs + mi * mbs * dp + dp_rank * mbs, mbs, S, cfg);
          double denom = 0;
          for (float x : mb.loss_mask) denom += x;
          const DeviceMicrobatch d = eval_slot.upload(mb, D.learned_pos, D.tp_rank * D.V_local, D.V_local, D.max_pos, stream, wait_event);
          model.step(d, 0.0f, static_cast<float>(1.0 / std::max(denom, 1.0)), eval_acc);
          ++n;
        }
      }
      float acc = 0;
      wait_stream();
      MT_CUDA_CHECK(cudaMemcpy(&acc, eval_acc, 4, cudaMemcpyDeviceToHost));
      float vlf = acc / static_cast<float>(std::max<int64_t>(n, 1));
      if (dp > 1) dp_average(&vlf, 1);
      const double vl = vlf;
      res.valid_losses.push_back(vl);
      if (lead) std::cout << format_validation_line(it, vl) << "\n" << std::flush;
      metrics.validation(it, vl, consumed);
    }
    if (saving) save_now(it);
    excluded_secs += std::chrono::duration<double>(Clock::now() - side_start).count();
    if (exiting) {
      if (lead) std::cout << "megatrain: exiting at iteration " << it << " (--exit-interval)\n";
      break;
    }
  }
  params_gathered();
  wait_stream();
  cudaEventDestroy(drained);
  if (saver) saver->wait();
  if (dist_opt) cudaFree(master);  // else the model's
  for (void* p : {static_cast<void*>(m), static_cast<void*>(v), static_cast<void*>(st), static_cast<void*>(partials),
                  static_cast<void*>(d_chunks), static_cast<void*>(eval_acc), static_cast<void*>(avg_buf), static_cast<void*>(loss_hist), static_cast<void*>(norm_hist),
                  static_cast<void*>(skip_hist)}) {
    cudaFree(p);
  }
  return res;
}

}  // namespace mt
