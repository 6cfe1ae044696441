// cuda_engine_step.cpp: the CUDA engine's iteration (the schedule over the staged microbatches, the gradient
// reductions, the norm, the skip decision and AdamW, all queued), its per-iteration history, evaluation,
// checkpoints and the per-op profile.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>

#include "config/moe_pattern.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/moe.h"
#include "model/context_parallel.h"
#include "pipeline/configured_schedule.h"
#include "pipeline/cuda_stage.h"
#include "pipeline/schedule.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"
#include "tensor/cuda/op_profiler.h"
#include "tensor/dtype.h"
#include "train/cuda_engine.h"
#include "train/moe_report.h"
#include "train/train_common.h"

namespace mt {

void CudaEngine::wait_event(cudaEvent_t ev) {
#ifdef MEGATRAIN_HAVE_NCCL
  if (tp_nccl_) {
    tp_nccl_->wait_event(ev, "training step");
    return;
  }
  if (ddp_) {
    ddp_->comm().wait_event(ev, "training step");
    return;
  }
  if (pp_nccl_) {
    pp_nccl_->wait_event(ev, "training step");
    return;
  }
#endif
  MT_CUDA_CHECK(cudaEventSynchronize(ev));
}

void CudaEngine::wait_stream() {
  MT_CUDA_CHECK(cudaEventRecord(drained_, stream_));
  wait_event(drained_);
}

cuda::StepState CudaEngine::read_state() {
  cuda::StepState h{};
  wait_stream();
  MT_CUDA_CHECK(cudaMemcpy(&h, st_, sizeof(h), cudaMemcpyDeviceToHost));
  return h;
}

// With the distributed optimizer a rank's own non-finite loss poisons the gradient partials, so every rank
// skips the step together (each updates only its shard: one skipping alone would split the model).
void CudaEngine::norm_partials(const float* x, bool by_state, const float* loss, float host_part) {
  if (by_state) {
    cuda::sumsq_partials(partials_, x, d_gpu_chunks_, static_cast<int64_t>(gpu_chunks_.size()), true, stream_);
  } else {
    cuda::sumsq_partials(partials_, x, d_chunks_, static_cast<int64_t>(chunks_.size()), false, stream_);
  }
  if (host_part != 0.0f) cuda::add_to_first(partials_, host_part, stream_);
  if (loss && dist_opt_) cuda::poison_if_nonfinite(partials_, loss, stream_);
#ifdef MEGATRAIN_HAVE_NCCL
  if (tp_nccl_) tp_nccl_->all_reduce_on(partials_, cuda::kNormPartials, WireType::kF32, ReduceOp::kSum, stream_);
  if (dist_opt_) dp_nccl_->all_reduce_on(partials_, cuda::kNormPartials, WireType::kF32, ReduceOp::kSum, stream_);
  if (pp_nccl_) pp_nccl_->all_reduce_on(partials_, cuda::kNormPartials, WireType::kF32, ReduceOp::kSum, stream_);  // every stage's
#endif
}

// Through the NCCL group on a small device buffer, so torchrun-style launches without MPI work too.
void CudaEngine::reduce_through_device(Communicator& group, float* values, int64_t n, ReduceOp op) {
  MT_CUDA_CHECK(cudaMemcpy(avg_buf_, values, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  MT_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may still be in flight; NCCL's stream is not ordered with it
  group.all_reduce(avg_buf_, n, op);
  MT_CUDA_CHECK(cudaMemcpy(values, avg_buf_, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost));
}

void CudaEngine::dp_average(float* values, int64_t n) { reduce_through_device(*groups_.dp_cp, values, n, ReduceOp::kAvg); }

// Every bucket's parameters on the compute stream (the overlapped gather is otherwise waited for by the next
// forward): before the weights leave the device and at the end.
void CudaEngine::params_gathered() {
#ifdef MEGATRAIN_HAVE_NCCL
  if (overlap_gather_) ddp_->wait_params(INT64_MAX);
#endif
}

void CudaEngine::make_drop_keys(const Microbatch& mb, int64_t step) {
  drop_keys_.clear();
  if (cfg_.model.hidden_dropout <= 0) return;
  const auto seed = static_cast<uint64_t>(cfg_.training.seed);
  for (int64_t b = 0; b < mb.B; ++b) {
    drop_keys_.push_back(dropout_key(seed, step, mb.first_sample + b, -1, kDropEmbedding));
    for (int64_t l = 0; l < model_->dims().L; ++l) {
      drop_keys_.push_back(dropout_key(seed, step, mb.first_sample + b, l, kDropAttnOut));
      drop_keys_.push_back(dropout_key(seed, step, mb.first_sample + b, l, kDropMlpOut));
    }
  }
}

double CudaEngine::activation_gib() const {
  double bytes = 0;
  for (const CudaGPT* m : chunks_models_) bytes += static_cast<double>(m->activation_bytes());
  return bytes / (1024.0 * 1024.0 * 1024.0);
}

StagePipeline CudaEngine::stage_pipeline() {
  if (pp_ == 1) return {};
  return {link_.get(), static_cast<int>(pp_rank_), static_cast<int>(pp_), boundary_activations_.get(), boundary_gradients_.get()};
}

// The iteration's gradients zeroed, but for those the chunks' first weight gradient GEMMs overwrite
// (MEGATRAIN_WGRAD_OVERWRITE=1: CudaGPT::overwritten_gradients). MEGATRAIN_WGRAD_OVERWRITE=check fills those with NaN
// instead (all bytes 0xFF), for the tests: a range that a GEMM accumulated into, or one read before its first write,
// then shows in the losses.
void CudaEngine::zero_gradients() {
  const bool check = CudaGPT::wgrad_overwrite_mode() == CudaGPT::WgradOverwrite::kCheck;
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (CudaGPT* m : chunks_models_) {
    m->begin_gradients();
    kept.insert(kept.end(), m->overwritten_gradients().begin(), m->overwritten_gradients().end());
  }
  std::sort(kept.begin(), kept.end());
  int64_t from = 0;
  for (const auto& [offset, count] : kept) {
    if (offset > from) MT_PROF("opt.zero_grads", MT_CUDA_CHECK(cudaMemsetAsync(model_->grads() + from, 0, static_cast<size_t>(offset - from) * 4, stream_)));
    if (check) MT_CUDA_CHECK(cudaMemsetAsync(model_->grads() + offset, 0xFF, static_cast<size_t>(count) * 4, stream_));
    from = std::max(from, offset + count);
  }
  if (P_ > from) MT_PROF("opt.zero_grads", MT_CUDA_CHECK(cudaMemsetAsync(model_->grads() + from, 0, static_cast<size_t>(P_ - from) * 4, stream_)));
}

void CudaEngine::step(int64_t it, int64_t base, int64_t nmb_it, double lr) {
  const Config& cfg = cfg_;
  const ModelDims& D = model_->dims();
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const int64_t dp = groups_.dp->size(), dp_rank = groups_.dp->rank();
  const double waited_before = MicrobatchSlot::wait_ms;
  const int64_t mallocs_before = DeviceAllocator::instance().stats().device_mallocs;
  if (it == profile_iter_) OpProfiler::instance().enable(stream_);
  zero_gradients();
#ifdef MEGATRAIN_HAVE_NCCL
  if (ddp_) ddp_->start_iteration();
  if (expert_ddp_) expert_ddp_->start_iteration();
#endif
  // The schedule's microbatches: each staged on the device with its share of the loss gradient (its tokens' mean over
  // the microbatches; --calculate-per-token-loss, Megatron's: their sum, divided at the step by the global batch's loss
  // tokens). The loss reported is Megatron's either way: the summed token losses over the global batch's loss tokens
  // (step_prepare).
  const bool per_token = cfg.training.calculate_per_token_loss;
  double tokens = 0;
  const std::function<void(cudaEvent_t)> wait = [this](cudaEvent_t ev) { wait_event(ev); };
  CudaPipelineStage stage(
      chunks_models_,
      [&](int64_t mi) {
        const Microbatch whole = make_microbatch(data_, Split::kTrain, base + mi * mbs * dp + dp_rank * mbs, mbs, S, cfg);
        // Context parallelism: this rank's two chunks of each sequence; the loss is the whole sequences' mean (each CP
        // rank's gradient a part of it, times the CP size: the gradients are averaged over DP x CP, as Megatron's).
        const Microbatch mb = context_parallel_slice(whole, cp_rank_, cp_);
        double denom = 0;
        for (float x : whole.loss_mask) denom += x;
        for (float x : mb.loss_mask) tokens += x;  // (this rank's, summed over DP x CP below)
        denom = std::max(denom, 1.0);
        MicrobatchSlot& slot = *slots_[static_cast<size_t>((it % 2) * nmb_max_ + mi)];
        make_drop_keys(mb, it);
        // (--calculate-per-token-loss: the step's scale by the DP x CP group's loss tokens makes them the whole sum)
        const float w_mb = per_token ? 1.0f : static_cast<float>(static_cast<double>(cp_) / (denom * static_cast<double>(nmb_it)));  // (the gradient's)
        DeviceMicrobatch d = slot.upload(mb, D.learned_pos, D.tp_rank * D.V_local, D.V_local, D.max_pos, stream_, wait, drop_keys_);
        // MoE: the aux losses' share, as the lm loss's (under CP times the CP size, as its: each rank's gradient is its tokens' part).
        // --calculate-per-token-loss: as the lm loss's sum, times the microbatch's tokens (whole sequences: the CPU engine's
        // MoE unit, the same scale as without the flag when every token counts), since the step divides every gradient by
        // the global batch's loss tokens.
        const double routed = static_cast<double>(mbs * S);
        d.aux_grad_scale = static_cast<float>(per_token ? grad_share_ * routed : grad_share_ * static_cast<double>(cp_) / static_cast<double>(nmb_it));
        if (cfg.model.attention_dropout > 0) d.attention_seed = dropout_key(static_cast<uint64_t>(cfg.training.seed), it, mb.first_sample, -1, kDropAttnProbs);
        return CudaPipelineStage::Staged{d, w_mb * grad_share_, 1.0f};
      },
      &st_->loss_acc, stage_pipeline());
  run_schedule(training_schedule(cfg, pp_rank_, pp_, nmb_it), stage);
  for (const CudaGPT* m : chunks_models_) m->check_gradients_written();  // (MEGATRAIN_WGRAD_OVERWRITE: none left unzeroed)
#ifdef MEGATRAIN_HAVE_NCCL
  if (pp_nccl_) {
    // Tied embeddings across the stages (Megatron's _allreduce_word_embedding_grads): the first stage's word
    // embeddings and the last stage's copy take the sum of both gradients, before the data-parallel reduction.
    if (embedding_nccl_) MT_PROF("pp.tied_embedding_grads", embedding_nccl_->all_reduce_on(model_->grads() + tied_offset_, tied_numel_, WireType::kF32,
                                                                                            ReduceOp::kSum, stream_));
    // The loss is the last stage's (the others hold 0): every stage takes the same skip decision.
    MT_PROF("pp.loss", pp_nccl_->all_reduce_on(&st_->loss_acc, 1, WireType::kF32, ReduceOp::kSum, stream_));
  }
  // (MoE: the experts' reductions after the dense ones, which the compute stream waits for first, so that the two
  // groups' reductions never run at once)
  if (ddp_) MT_PROF("dp.grad_all_reduce_wait", ddp_->finish());
  if (expert_ddp_) MT_PROF("dp.expert_grad_reduce_wait", expert_ddp_->finish());
#endif
  const float clip = static_cast<float>(cfg.training.clip_grad);
  const float b1 = static_cast<float>(cfg.training.adam_beta1), b2 = static_cast<float>(cfg.training.adam_beta2);
  const float eps = static_cast<float>(cfg.training.adam_eps), wd = static_cast<float>(cfg.training.weight_decay);
  // This rank's loss tokens, summed over DP on the device (no host wait).
  cuda::set_value(&st_->loss_tokens, static_cast<float>(tokens), stream_);
#ifdef MEGATRAIN_HAVE_NCCL
  if (dp_nccl_ && dp_ > 1) MT_PROF("dp.loss_tokens", dp_nccl_->all_reduce_on(&st_->loss_tokens, 1, WireType::kF32, ReduceOp::kSum, stream_));
#endif
  MT_PROF("opt.grad_norm", norm_partials(model_->grads(), false, &st_->loss_acc));
  if (zeros_hist_) {  // (--log-num-zeros-in-grad: the gradients the norm measures, before the update; summed over the ranks at the read)
    MT_CUDA_CHECK(cudaMemsetAsync(zeros_hist_ + pending_, 0, sizeof(double), stream_));
    MT_PROF("opt.count_zeros", cuda::add_zero_count(zeros_hist_ + pending_, model_->grads(), d_chunks_, static_cast<int64_t>(chunks_.size()), stream_));
  }
  cuda::step_prepare(st_, partials_, clip, b1, b2, 1.0f, scale_rule_, stream_, static_cast<float>(dp_), per_token ? static_cast<float>(dp_) : 0.0f);
  // --decoupled-lr: the word embeddings' and output layer's rate, from the iteration's first sample (as the CPU engine).
  const float decoupled_lr = decoupled_ ? static_cast<float>(decoupled_->lr_at_samples(base - resumed_.lr_schedule_start_samples)) : -1.0f;
  auto adamw = [&](int64_t first, int64_t count) {
    if (count <= 0) return;
    MT_PROF("opt.adamw", cuda::adamw_multi({.w = master_, .m = m_, .v = v_, .m16 = m16_, .v16 = v16_, .w16 = model_->working(), .g = model_->grads(),
                                            .chunks = d_gpu_chunks_ + first, .count = count, .state = st_, .lr = static_cast<float>(lr), .beta1 = b1,
                                            .beta2 = b2, .eps = eps, .weight_decay = wd, .decoupled_lr = decoupled_lr, .type = model_->half_type()}, stream_));
  };
  const auto n_chunks = static_cast<int64_t>(gpu_chunks_.size());
  // The offloaded share (after the device's own update is queued, which runs meanwhile): the host waits for this
  // step's state and gradients, and the training stream for the weights it sends back.
  if (offload_) offload_->start(model_->grads(), st_, stream_);
  auto offloaded = [&]() {
    if (!offload_) return;
    HostAdamStep hs;
    hs.lr = static_cast<float>(lr);
    hs.beta1 = b1;
    hs.beta2 = b2;
    hs.eps = eps;
    hs.weight_decay = wd;
    hs.decoupled_lr = decoupled_lr;
    hs.fp16 = cfg.precision.fp16;
    hs.exp_avg_bf16 = m16_ != nullptr;
    hs.exp_avg_sq_bf16 = v16_ != nullptr;
    MT_PROF("opt.offloaded_adamw", offload_->finish(model_->working(), stream_, hs, [this](cudaEvent_t ev) { wait_event(ev); }));
  };
  // Data parallelism: the MoE statistics summed over the replicas (the expert bias and the log take every replica's
  // tokens, as the CPU engine's; the losses are averaged at the log). Before the parameter gathers: on the same
  // communicator it would wait for all of them, and the next forward would overlap none.
#ifdef MEGATRAIN_HAVE_NCCL
  if (moe_row_ > 0 && dp_ > 1) {
    for (CudaGPT* m : chunks_models_) m->sum_moe_stats(*dp_nccl_);
  }
#endif
  // Aux-loss-free balancing (Megatron's expert bias): each MoE layer's bias from the iteration's expert counts,
  // before they are cleared (as the CPU engine, after the step; the bias is no parameter of the optimizer).
  if (cfg.moe.moe_router_enable_expert_bias) {
    for (CudaGPT* m : chunks_models_) m->update_expert_biases(static_cast<float>(cfg.moe.moe_router_bias_update_rate));
  }
  // Quantile balancing (Megatron's _update_router_qb_beta): each MoE layer's qb_beta from the iteration's quantiles,
  // summed over the replicas above.
  if (cfg.moe.load_balancing_is("quantile_balancing")) {
    for (CudaGPT* m : chunks_models_) m->update_quantile_biases(cfg.moe.moe_router_quantile_balancing_ema);
  }
#ifdef MEGATRAIN_HAVE_NCCL
  // Distributed optimizer: each rank updates the working weights of its blocks; every rank gets all of them,
  // after the step or (--overlap-param-gather) bucket by bucket as the step updates them, on the
  // communicator's stream, while the rest of the step and the next forward run.
  if (overlap_gather_) {
    if (expert_chunks_.second > expert_chunks_.first) adamw(expert_chunks_.first, expert_chunks_.second - expert_chunks_.first);
    if (expert_ddp_) MT_PROF("dp.expert_param_gather", expert_ddp_->gather_params(model_->working()));
    ddp_->start_param_gather(model_->working(), [&](int64_t lo) {
      const auto [first, last] = bucket_chunks_.at(lo);
      if (last > first) adamw(first, last - first);
    });
  } else {
    adamw(0, n_chunks);
    offloaded();
    if (dist_opt_) MT_PROF("dp.param_gather", ddp_->gather_params(model_->working()));
    if (expert_ddp_) MT_PROF("dp.expert_param_gather", expert_ddp_->gather_params(model_->working()));
  }
#else
  adamw(0, n_chunks);
  offloaded();
#endif
  if (it == profile_iter_) profile_report(it, waited_before, mallocs_before);
  const auto slot = static_cast<size_t>(pending_);
  if (slot > static_cast<size_t>(cfg.logging.log_interval)) throw std::logic_error("CUDA engine: more steps queued than the history holds");
  MT_CUDA_CHECK(cudaMemcpyAsync(loss_hist_ + slot, &st_->loss, 4, cudaMemcpyDeviceToDevice, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(norm_hist_ + slot, &st_->grad_norm, 4, cudaMemcpyDeviceToDevice, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(skip_hist_ + slot, &st_->skip, 4, cudaMemcpyDeviceToDevice, stream_));
  if (moe_row_ > 0) {  // this step's MoE statistics (each chunk's rows in turn), then a clean sum for the next
    size_t at = slot * static_cast<size_t>(moe_row_);
    for (CudaGPT* m : chunks_models_) {
      const auto row = static_cast<size_t>(m->moe_layer_count() * m->moe_stats_row());
      if (row == 0) continue;
      MT_CUDA_CHECK(cudaMemcpyAsync(moe_hist_ + at, m->moe_stats(), row * 4, cudaMemcpyDeviceToDevice, stream_));
      m->zero_moe_stats();
      at += row;
    }
  }
  // (a stage without MoE layers still takes part in the report's sums over the pipeline)
  if (cfg.moe.num_experts) moe_microbatches_.push_back(nmb_it);
  ++pending_;
}

// The step's only possible host waits: a staging buffer still being copied (the two-iteration run-ahead bound)
// and a cudaMalloc (an implicit device synchronisation) in the allocator. Both are reported.
void CudaEngine::profile_report(int64_t it, double waited_before, int64_t mallocs_before) {
  const int64_t mallocs = DeviceAllocator::instance().stats().device_mallocs - mallocs_before;
  const auto prof = OpProfiler::instance().collect();
  double total = 0;
  for (const auto& [name, ms] : prof) total += ms;
  if (lead_) {
    std::printf("megatrain: profile of iteration %lld: device time in named ops %.1f ms (summed over streams); host waits inside the step: %.1f ms for "
                "staging buffers, %lld cudaMalloc calls\n",
                static_cast<long long>(it), total, MicrobatchSlot::wait_ms - waited_before, static_cast<long long>(mallocs));
    for (const auto& [name, ms] : prof) std::printf("  %-28s %9.2f ms %6.1f%%\n", name.c_str(), ms, 100.0 * ms / total);
    std::fflush(stdout);
  }
  // MEGATRAIN_PROFILE_TIMELINE=PREFIX: every rank writes PREFIX.rankN.csv, each region's stream, start and end
  // (ms from the start of the step): what overlapped what (side-stream GEMMs, NCCL collectives).
  if (const char* tl = std::getenv("MEGATRAIN_PROFILE_TIMELINE")) {
    const std::string path = std::string(tl) + ".rank" + std::to_string(groups_.world->rank()) + ".csv";
    std::ofstream f(path);
    if (!f) throw std::runtime_error("cannot write the profile timeline " + path + ": check MEGATRAIN_PROFILE_TIMELINE");
    f << "name,stream,start_ms,end_ms\n";
    for (const auto& sp : OpProfiler::instance().timeline()) f << sp.name << "," << sp.stream << "," << sp.start_ms << "," << sp.end_ms << "\n";
  }
}

std::vector<StepReport> CudaEngine::read_reports() {
  last_ = read_state();
  const auto n = static_cast<size_t>(pending_);
  std::vector<float> losses(n), norms(n);
  std::vector<int32_t> skips(n);
  if (n > 0) {
    MT_CUDA_CHECK(cudaMemcpy(losses.data(), loss_hist_, n * 4, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(cudaMemcpy(norms.data(), norm_hist_, n * 4, cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(cudaMemcpy(skips.data(), skip_hist_, n * 4, cudaMemcpyDeviceToHost));
    if (dp_ > 1) dp_average(losses.data(), static_cast<int64_t>(n));
  }
  std::vector<double> zeros(n, -1.0);
  if (zeros_hist_ && n > 0) {
#ifdef MEGATRAIN_HAVE_NCCL
    // (the ranks' counts summed as the norm's partials are: over TP, DP with the distributed optimizer, and PP; in place, in
    // double: a count passes 2^24)
    if (tp_nccl_) tp_nccl_->all_reduce(zeros_hist_, static_cast<int64_t>(n), ReduceOp::kSum);
    if (dist_opt_) dp_nccl_->all_reduce(zeros_hist_, static_cast<int64_t>(n), ReduceOp::kSum);
    if (pp_nccl_) pp_nccl_->all_reduce(zeros_hist_, static_cast<int64_t>(n), ReduceOp::kSum);
#endif
    MT_CUDA_CHECK(cudaMemcpy(zeros.data(), zeros_hist_, n * sizeof(double), cudaMemcpyDeviceToHost));
    // (Megatron logs the count as the fp32 value its max over the model-parallel group passes through)
    for (size_t i = 0; i < n; ++i) zeros[i] = skips[i] != 0 ? -1.0 : static_cast<double>(static_cast<float>(std::nearbyint(zeros[i])));
  }
  pending_ = 0;
  std::vector<StepReport> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back({losses[i], norms[i], skips[i] != 0});
    out.back().num_zeros = zeros[i];
  }
  add_moe_reports(out);
  return out;
}

// Each read step's MoE statistics (docs/moe.md): the auxiliary losses averaged over its microbatches and the model's MoE
// layers, and the tokens per expert (min / mean / max over layers x experts), as the CPU engine reports them. Under
// pipeline parallelism each stage holds its own layers' rows: the sums and extremes are taken over the stages (every
// stage calls, with MoE layers or without).
void CudaEngine::add_moe_reports(std::vector<StepReport>& out) {
  const std::vector<int64_t> microbatches = std::exchange(moe_microbatches_, {});
  if (!cfg_.moe.num_experts || out.empty()) return;
  if (microbatches.size() != out.size()) throw std::logic_error("CUDA engine: MoE statistics for another number of steps");
  const int64_t E = model_->dims().experts, row_floats = model_->moe_stats_row(), local_layers = moe_row_ / row_floats;
  constexpr size_t head = static_cast<size_t>(cuda::kMoeStatsHead), kSums = head + 1;  // (the row's losses, then the tokens kept)
  int64_t layers = 0;
  for (bool moe : moe_layer_pattern(cfg_)) layers += moe ? 1 : 0;
  // (a rank's tokens: under context parallelism its share of each sequence)
  const int64_t tokens_per_microbatch = cfg_.training.micro_batch_size.value_or(1) * cfg_.data.seq_length.value_or(0) / cp_;
  std::vector<float> hist(out.size() * static_cast<size_t>(moe_row_));
  if (moe_row_ > 0) MT_CUDA_CHECK(cudaMemcpy(hist.data(), moe_hist_, hist.size() * 4, cudaMemcpyDeviceToHost));
  // Per step: the sums (each load-balancing loss, z, tokens kept) and the extremes (-min, max) of this stage's rows.
  const size_t steps = out.size();
  std::vector<float> sums(kSums * steps, 0.0f), extremes(2 * steps, -std::numeric_limits<float>::infinity());
  for (size_t i = 0; i < steps; ++i) {
    const float* step = hist.data() + i * static_cast<size_t>(moe_row_);
    for (int64_t l = 0; l < local_layers; ++l) {
      const float* row = step + l * row_floats;
      for (size_t j = 0; j < head; ++j) sums[kSums * i + j] += row[j];
      for (int64_t e = 0; e < E; ++e) {
        extremes[2 * i] = std::max(extremes[2 * i], -row[head + static_cast<size_t>(e)]);
        extremes[2 * i + 1] = std::max(extremes[2 * i + 1], row[head + static_cast<size_t>(e)]);
        sums[kSums * i + head] += row[head + static_cast<size_t>(e)];
      }
    }
  }
  // --moe-per-layer-logging: per step, [kMoeLossSlots][num_layers] of each layer's losses (moe_report.h's slots, the
  // row's order: the three load-balancing losses, then z; a stage's own layers, the others 0).
  static_assert(kMoeLossSlots == head, "the per-layer slots are the statistics row's losses");
  const auto L = static_cast<size_t>(cfg_.model.num_layers.value_or(0));
  std::vector<float> per_layer(cfg_.moe.moe_per_layer_logging ? steps * kMoeLossSlots * L : 0, 0.0f);
  if (!per_layer.empty()) {
    std::vector<int64_t> global;
    for (const CudaGPT* m : chunks_models_) {
      for (int64_t g : m->moe_layer_indices()) global.push_back(g);
    }
    for (size_t i = 0; i < steps; ++i) {
      for (size_t l = 0; l < global.size(); ++l) {
        const float* row = hist.data() + i * static_cast<size_t>(moe_row_) + l * static_cast<size_t>(row_floats);
        for (size_t j = 0; j < kMoeLossSlots; ++j) per_layer[(i * kMoeLossSlots + j) * L + static_cast<size_t>(global[l])] = row[j];
      }
    }
  }
  if (pp_ > 1) {
    reduce_through_device(*groups_.pp, sums.data(), static_cast<int64_t>(sums.size()), ReduceOp::kSum);
    reduce_through_device(*groups_.pp, extremes.data(), static_cast<int64_t>(extremes.size()), ReduceOp::kMax);
    if (!per_layer.empty()) reduce_through_device(*groups_.pp, per_layer.data(), static_cast<int64_t>(per_layer.size()), ReduceOp::kSum);
  }
  if (layers == 0) return;  // (--num-experts with every layer dense by --moe-layer-freq: nothing to report, as the CPU engine)
  const auto& moe = cfg_.moe;
  const bool capacity = moe.moe_expert_capacity_factor.has_value();
  const bool z = moe.moe_z_loss_coeff.value_or(0.0) > 0;
  for (size_t i = 0; i < steps; ++i) {
    // (summed over the DP replicas at the step: the losses' average, the routed choices of every replica)
    const double per = static_cast<double>(std::max<int64_t>(1, microbatches[i])) * static_cast<double>(layers) * static_cast<double>(dp_);
    StepReport& r = out[i];
    for (const auto& [slot, name] : logged_balance_losses(moe)) r.moe_losses.emplace_back(name, sums[kSums * i + slot] / per);
    if (z) r.moe_losses.emplace_back("z_loss", sums[kSums * i + head - 1] / per);
    if (!per_layer.empty()) {
      const std::vector<double> step(per_layer.begin() + static_cast<std::ptrdiff_t>(i * kMoeLossSlots * L),
                                     per_layer.begin() + static_cast<std::ptrdiff_t>((i + 1) * kMoeLossSlots * L));
      add_layer_losses(moe, step, 1.0 / (per / static_cast<double>(layers)), r);
    }
    r.expert_tokens_min = -extremes[2 * i];
    r.expert_tokens_max = extremes[2 * i + 1];
    r.expert_tokens_mean = sums[kSums * i + head] / static_cast<double>(layers * E);
    // The choices routed (every microbatch's tokens, top k, each MoE layer) less those kept (the counts).
    const double routed = per * static_cast<double>(tokens_per_microbatch * model_->dims().topk);
    const double kept = sums[kSums * i + head];
    r.dropped_fraction = capacity && routed > 0 && kept < routed ? (routed - kept) / routed : 0.0;  // (dropless: none, exactly)
  }
}

// The fp32 master weights, through the gradient-norm kernel's partial sums (the device is drained here, and
// the next step recomputes its own partials), summed over TP and, with the distributed optimizer, over the DP
// shards.
double CudaEngine::params_norm() {
  // The offloaded master weights' share is summed on the CPU (they are current: each step's update ends on the host).
  norm_partials(master_, true, nullptr, offload_ ? static_cast<float>(offload_->master_sumsq()) : 0.0f);
  std::vector<float> part(cuda::kNormPartials);
  MT_CUDA_CHECK(cudaMemcpyAsync(part.data(), partials_, part.size() * 4, cudaMemcpyDeviceToHost, stream_));
  wait_stream();
  double sq = 0;
  for (float x : part) sq += x;
  return std::sqrt(sq);
}

double CudaEngine::evaluate(int64_t iteration, Split split, int64_t first_sample) {
  (void)iteration;  // evaluation draws no dropout
  const Config& cfg = cfg_;
  const ModelDims& D = model_->dims();
  // (the evaluation's microbatch is the training's: capabilities.cpp refuses another --eval-micro-batch-size here)
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length, gbs = cfg.derived.eval_global_batch_size;
  const int64_t dp = groups_.dp->size(), dp_rank = groups_.dp->rank();
  const std::function<void(cudaEvent_t)> wait = [this](cudaEvent_t ev) { wait_event(ev); };
  MT_CUDA_CHECK(cudaMemsetAsync(eval_acc_, 0, 4, stream_));
  // Megatron's: the token losses summed over the loss tokens they cover.
  double n = 0;
  const int64_t nmb = cfg.derived.eval_num_microbatches;
  for (int64_t e = 0; e < cfg.logging.eval_iters; ++e) {
    // The forwards through the stages (the loss the last stage's), each microbatch staged as its forward comes.
    CudaPipelineStage stage(
        chunks_models_,
        [&](int64_t mi) {
          const Microbatch mb = context_parallel_slice(make_microbatch(data_, split, first_sample + e * gbs + mi * mbs * dp + dp_rank * mbs, mbs, S, cfg), cp_rank_, cp_);
          double denom = 0;
          for (float x : mb.loss_mask) denom += x;  // (this rank's: the sums run over DP x CP)
          MicrobatchSlot& slot = *eval_slots_[static_cast<size_t>(mi) % eval_slots_.size()];
          n += denom;
          return CudaPipelineStage::Staged{slot.upload(mb, D.learned_pos, D.tp_rank * D.V_local, D.V_local, D.max_pos, stream_, wait), 0.0f, 1.0f};
        },
        eval_acc_, stage_pipeline());
    run_schedule(evaluation_schedule(cfg, pp_rank_, pp_, nmb), stage);
  }
#ifdef MEGATRAIN_HAVE_NCCL
  if (pp_nccl_) pp_nccl_->all_reduce_on(eval_acc_, 1, WireType::kF32, ReduceOp::kSum, stream_);
#endif
  float acc = 0;
  wait_stream();
  MT_CUDA_CHECK(cudaMemcpy(&acc, eval_acc_, 4, cudaMemcpyDeviceToHost));
  float sums[2] = {acc, static_cast<float>(n)};
  if (dp_ > 1) dp_average(sums, 2);
  return sums[0] / std::max(sums[1], 1.0f);
}

void CudaEngine::save(TrainState state) {
  const Config& cfg = cfg_;
  params_gathered();
  const cuda::StepState h = read_state();
  if (!keep_host_) {
    auto empty = std::make_unique<Snapshot>();
    empty->who.world_rank = groups_.world->rank();
    empty->who.world_size = groups_.world->size();
    empty->who.writes_params = empty->who.writes_optimizer = false;
    empty->state.iteration = state.iteration;
    empty->layout_json = "{}";
    saver_->save(std::move(empty));
    return;
  }
  // The device's share of the state (the offloaded share is already in the host optimizer's arrays: setup made
  // them the offloaded optimizer's own on every rank that keeps them).
  const size_t state_bytes = static_cast<size_t>(n_state_ - n_offloaded_) * 4;
  MT_CUDA_CHECK(cudaMemcpy(host_opt_->master() + n_offloaded_, master_, state_bytes, cudaMemcpyDeviceToHost));
  if (m16_) cuda::moment_to_host(host_opt_->exp_avg() + n_offloaded_, m16_, n_state_ - n_offloaded_);
  else MT_CUDA_CHECK(cudaMemcpy(host_opt_->exp_avg() + n_offloaded_, m_, state_bytes, cudaMemcpyDeviceToHost));
  if (v16_) cuda::moment_to_host(host_opt_->exp_avg_sq() + n_offloaded_, v16_, n_state_ - n_offloaded_);
  else MT_CUDA_CHECK(cudaMemcpy(host_opt_->exp_avg_sq() + n_offloaded_, v_, state_bytes, cudaMemcpyDeviceToHost));
  host_opt_->set_iterations(h.t);
  if (!dist_opt_) {
    host_opt_->refresh_working_weights();
  } else if (dp_rank_ == 0 || groups_.expert_dp->rank() == 0) {
    // This rank holds the master weights of its shard only; the working weights of every shard were gathered
    // after the step: they are the parameters to write (the dense ones by DP rank 0, the experts by expert-DP rank 0).
    std::vector<uint16_t> w16(static_cast<size_t>(P_));
    MT_CUDA_CHECK(cudaMemcpy(w16.data(), model_->working(), static_cast<size_t>(P_) * 2, cudaMemcpyDeviceToHost));
    float* hp = host_->params().f32();
    if (cfg.precision.fp16) {
      for (int64_t i = 0; i < P_; ++i) hp[i] = fp16_to_float(w16[static_cast<size_t>(i)]);
    } else {
      for (int64_t i = 0; i < P_; ++i) hp[i] = bf16_to_float(w16[static_cast<size_t>(i)]);
    }
  }
  state.scaler = {cfg.precision.fp16 ? h.loss_scale : 1.0f, h.hysteresis_left, h.clean_steps, scaler_.dynamic()};
  CheckpointRank who;
  who.world_rank = groups_.world->rank();
  who.world_size = groups_.world->size();
  who.writes_params = dp_rank_ == 0;
  who.writes_optimizer = dp_rank_ == 0 || dist_opt_;
  // (MoE: the experts by expert-DP rank 0, their optimizer state by every rank with the distributed optimizer; without EP
  // expert-DP is the DP group)
  who.writes_expert_params = groups_.expert_dp->rank() == 0;
  who.writes_expert_optimizer = groups_.expert_dp->rank() == 0 || dist_opt_;
  for (const CudaGPT* m : chunks_models_) m->download_router_biases(*host_);  // (fp32: not in the working weights)
  auto snap = take_snapshot(cfg, *host_, *host_opt_, state, who, !cfg.checkpoint.no_save_optim);
  if (groups_.tp->rank() == 0 && dp_rank_ == 0) {  // FP8 delayed scaling: one writer per stage
    for (CudaGPT* m : chunks_models_) {
      if (m->fp8_delayed()) add_fp8_scaling_to(*snap, m->fp8_scaling_state());
    }
  }
  saver_->save(std::move(snap));
}

void CudaEngine::finish() {
  params_gathered();
  wait_stream();
  if (saver_) saver_->wait();
}

}  // namespace mt
