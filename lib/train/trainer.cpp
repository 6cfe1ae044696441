// trainer.cpp: Megatron's train() loop on the reference engine.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "checkpoint/checkpoint.h"
#include "data/token_source.h"
#include "model/gpt_model.h"
#include "optim/loss_scaler.h"
#include "optim/data_parallel.h"
#include "optim/batch_schedule.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "pipeline/cpu_stage.h"
#include "pipeline/schedule.h"
#include "plan/flops.h"
#include "train/log_line.h"
#include "train/train_common.h"

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

double evaluate(GPTModel& model, const TokenSource& src, const Config& cfg, ProcessGroups& groups, int64_t step) {
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const int64_t dp = groups.dp->size(), r = groups.dp->rank();
  const int64_t per_iter = cfg.derived.global_batch_size;
  double sum = 0;
  int64_t n = 0;
  for (int64_t it = 0; it < cfg.logging.eval_iters; ++it) {
    for (int64_t m = 0; m < cfg.derived.num_microbatches; ++m) {
      const int64_t first = it * per_iter + m * mbs * dp + r * mbs;
      const Microbatch mb = make_microbatch(src, Split::kValid, first, mbs, S, cfg);
      sum += model.forward(mb, step, false);
      ++n;
    }
  }
  double buf[2] = {sum, static_cast<double>(n)};
  groups.dp->all_reduce(buf, 2, ReduceOp::kSum);
  return buf[0] / std::max(1.0, buf[1]);
}

}  // namespace

TrainResult train(const Config& cfg, ProcessGroups groups, const TrainOptions& opt) {
  const bool lead = opt.rank == 0 && !opt.quiet;
  auto src = open_training_data(cfg);
  auto model_ptr = std::make_shared<GPTModel>(cfg, groups);
  GPTModel& model = *model_ptr;
  DataParallel data_parallel(cfg, model.params(), groups.dp_cp);
  Optimizer optimizer(cfg, model.params(), groups, data_parallel.owned_ranges(),
                      data_parallel.distributed_optimizer() && groups.dp_cp->size() > 1);
  model.set_grads_ready_hook([&](int64_t lowest) { data_parallel.on_grads_ready(lowest); });
  LrSchedule schedule(cfg);
  LossScaler scaler(cfg);
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const int64_t nmb = cfg.derived.num_microbatches, gbs = cfg.derived.global_batch_size;
  const int64_t world = cfg.derived.world_size;
  const int64_t dp = groups.dp->size(), dp_rank = groups.dp->rank();
  const BatchSchedule batches(cfg, dp);
  const double flops_full_batch = flops_per_iteration(cfg);  // at the full global batch; per sample below
  auto flops_of = [&](int64_t batch) { return flops_full_batch * static_cast<double>(batch) / static_cast<double>(gbs); };
  const double peak = 0;  // the CPU engine has no meaningful peak: MFU is reported on GPUs
  const bool has_valid = src->has_split(Split::kValid) && cfg.logging.eval_iters > 0;

  MetricsFile metrics(cfg, opt.rank, groups.world->size());
  if (lead) {
    const double p = static_cast<double>(model.params().numel());
    std::cout << "megatrain: data: " << src->describe() << "\n";
    std::cout << "megatrain: model: " << model.params().numel() << " parameters on this rank; memory: weights "
              << mib(p * 4) << ", gradients " << mib(p * 4) << ", optimizer state " << mib(static_cast<double>(optimizer.state_bytes()))
              << " (fp32 reference engine on CPU)\n";
  }

  TrainResult res;
  res.model = model_ptr;
  // Resume: parameters, optimizer state, loss scaler, iteration and data position.
  TrainState state;
  const auto& ck = cfg.checkpoint;
  if (ck.load) {
    const LoadOptions lo = load_options(cfg);
    if (!ck.ckpt_step && !latest_checkpoint(*ck.load)) {
      if (lead) std::cout << "megatrain: no checkpoint in " << *ck.load << " yet: starting from scratch\n";
    } else {
      state = load_checkpoint(*ck.load, lo, model.params(), optimizer, scaler);
      if (lead) {
        std::cout << "megatrain: loaded " << checkpoint_path(*ck.load, ck.ckpt_step.value_or(*latest_checkpoint(*ck.load)))
                  << (lo.finetune ? " (weights only, --finetune)" : "") << (!lo.load_optimizer && !lo.finetune ? " (without optimizer state)" : "")
                  << ": continuing after iteration " << state.iteration << "\n";
      }
    }
    res.skipped = state.skipped;
    res.nan_iterations = state.nan_iterations;
  }
  std::unique_ptr<CheckpointSaver> saver;
  if (ck.save) saver = make_saver(cfg, groups);
  CheckpointRank who;
  who.world_rank = groups.world->rank();
  who.world_size = groups.world->size();
  who.writes_params = groups.dp_cp->rank() == 0;
  who.writes_optimizer = data_parallel.distributed_optimizer() || groups.dp_cp->rank() == 0;
  // The run's length in iterations: fixed, or from --train-samples (under a batch-size ramp-up, Megatron's
  // count: the ramp's iterations, then whole full batches).
  const int64_t iters = cfg.training.train_iters ? *cfg.training.train_iters : batches.train_iterations(*cfg.training.train_samples);
  if (lead) {
    std::cout << "megatrain: training " << iters << " iterations of " << gbs << " samples x " << S << " tokens (" << nmb << " microbatches of " << mbs
              << " per data-parallel rank" << (batches.ramping() ? ", the batch ramped up from " + cfg.training.rampup_batch_size[0] : std::string())
              << "), world size " << world << "\n"
              << std::flush;
  }
  double flops_done = state.flops_so_far;
  int64_t consumed = state.consumed_samples;  // samples consumed by the iterations done
  auto save_now = [&](int64_t it) {
    data_parallel.finish_param_gather();
    state.flops_so_far = flops_done;
    state.iteration = it;
    state.consumed_samples = consumed;
    state.skipped = res.skipped;
    state.nan_iterations = res.nan_iterations;
    state.scaler = scaler.state();
    saver->save(take_snapshot(cfg, model.params(), optimizer, state, who, !ck.no_save_optim));
    if (lead) std::cout << "megatrain: " << (ck.async_save ? "saving" : "saved") << " checkpoint at iteration " << it << " to " << *ck.save << "\n" << std::flush;
  };
  IterationStats acc;
  int64_t nan_in_a_row = 0;
  double interval_loss = 0;
  int64_t interval_iters = 0;
  const int64_t first_iter = state.iteration + 1;
  double interval_secs = 0;  // training time only: evaluation and checkpoints are not counted
  int64_t interval_samples = 0;
  for (int64_t it = first_iter; it <= iters; ++it) {
    const auto iter_start = Clock::now();
    data_parallel.finish_param_gather();  // parameters updated by the other shards last step
    model.params().zero_grads();
    const float loss_scale = scaler.scale();
    // One schedule step: every microbatch of this DP rank, forward then backward (no pipelining).
    // The data position continues from the checkpoint's consumed samples (the batch size may differ).
    const int64_t base = consumed, batch = batches.global_batch(consumed), nmb_it = batch / (mbs * dp);
    CpuPipelineStage stage(
        model, [&](int64_t m) { return make_microbatch(*src, Split::kTrain, base + m * mbs * dp + dp_rank * mbs, mbs, S, cfg); }, it,
        loss_scale / static_cast<float>(nmb_it));
    run_schedule(no_pipelining_schedule(nmb_it), stage, [&] { data_parallel.arm(); });
    const double loss = stage.mean_loss();
    consumed += batch;
    flops_done += flops_of(batch);
    interval_samples += batch;
    data_parallel.finish();
    double loss_avg = loss;
    groups.dp_cp->all_reduce(&loss_avg, 1, ReduceOp::kAvg);
    // As Megatron's scheduler, stepped after each update: the update uses the rate of the samples consumed
    // before it (the first update the warmup's initial rate); the log shows the rate after it.
    const double lr = schedule.lr_at_samples(base);
    StepResult step{};
    const bool loss_finite = std::isfinite(loss_avg);
    if (loss_finite) step = optimizer.step(lr, loss_scale);
    if (loss_finite && !step.skipped) data_parallel.start_param_gather();
    const bool nonfinite = !loss_finite || step.skipped;
    if (scaler.update(nonfinite) && cfg.precision.fp16 && loss_finite) {
      ++res.skipped;  // fp16 overflow: the scaler shrinks and the step is skipped
    } else if (nonfinite) {
      ++res.nan_iterations;
      ++res.skipped;
    }
    // A non-finite loss always counts (no loss scale cures it); non-finite gradients only outside fp16.
    nan_in_a_row = !loss_finite || (nonfinite && !cfg.precision.fp16) ? nan_in_a_row + 1 : 0;
    if (nan_in_a_row >= cfg.training.exit_on_nan_count) {
      throw std::runtime_error("loss or gradient norm was not finite for " + std::to_string(nan_in_a_row) +
                               " iterations in a row (last at iteration " + std::to_string(it) +
                               "): lower --lr, raise --lr-warmup-iters or check the data");
    }
    res.losses.push_back(loss_avg);
    res.iterations = it;
    if (!nonfinite) {  // as Megatron: the logged loss leaves skipped iterations out
      interval_loss += loss_avg;
      ++interval_iters;
    }
    acc.grad_norm = step.grad_norm;
    acc.lr = schedule.lr_at_samples(consumed);
    interval_secs += std::chrono::duration<double>(Clock::now() - iter_start).count();
    if (it % cfg.logging.log_interval == 0 || it == iters) {
      const double secs = interval_secs;
      const int64_t n_iter = std::max<int64_t>(1, std::min(it - first_iter + 1, it % cfg.logging.log_interval == 0 ? cfg.logging.log_interval : it % cfg.logging.log_interval));
      IterationStats s = acc;
      s.iteration = it;
      s.train_iters = iters;
      s.consumed_samples = consumed;
      s.global_batch = batch;
      s.ms_per_iter = 1000.0 * secs / static_cast<double>(n_iter);
      s.tflops_per_gpu = flops_of(interval_samples) / secs / static_cast<double>(world) / 1e12;
      s.loss = interval_iters ? interval_loss / static_cast<double>(interval_iters) : NAN;
      s.loss_scale = scaler.scale();  // after this step's update, as Megatron logs it
      res.loss_scale = s.loss_scale;
      s.skipped = res.skipped;
      s.nan_iters = res.nan_iterations;
      s.tokens_per_s_per_gpu = static_cast<double>(interval_samples * S) / secs / static_cast<double>(world);
      s.mfu = peak > 0 ? s.tflops_per_gpu / peak : -1;
      if (cfg.logging.log_params_norm) s.params_norm = optimizer.params_norm();
      if (lead) std::cout << format_iteration_line(s) << "\n" << std::flush;
      metrics.iteration(s);
      interval_loss = 0;
      interval_iters = 0;
      interval_secs = 0;
      interval_samples = 0;
    }
    if (has_valid && (it % cfg.logging.eval_interval == 0 || it == iters)) {
      data_parallel.finish_param_gather();
      const double vl = evaluate(model, *src, cfg, groups, it);
      res.valid_losses.push_back(vl);
      if (lead) std::cout << format_validation_line(it, vl) << "\n" << std::flush;
      metrics.validation(it, vl, consumed);
    }
    const bool exiting = cfg.training.exit_interval && *cfg.training.exit_interval > 0 && it % *cfg.training.exit_interval == 0;
    if (saver && (it % *ck.save_interval == 0 || it == iters || exiting)) {
      save_now(it);
    }
    if (exiting) {
      if (lead) std::cout << "megatrain: exiting at iteration " << it << " (--exit-interval)\n";
      break;
    }
  }
  if (saver) saver->wait();
  data_parallel.finish_param_gather();
  return res;
}

}  // namespace mt
