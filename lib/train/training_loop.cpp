// training_loop.cpp: the loop. Timing: an interval's time is the wall time between two log reads less what
// the loop spent outside training (evaluation, checkpoints, the log itself); the CUDA engine's queued steps
// finish inside the read, so they count.
#include "train/training_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <stdexcept>

#include "config/resolve.h"
#include "optim/batch_schedule.h"
#include "optim/lr_schedule.h"
#include "plan/flops.h"
#include "train/log_line.h"
#include "train/train_common.h"

namespace mt {

using Clock = std::chrono::steady_clock;

namespace {
// --exit-duration-in-mins counts from the process's start, as Megatron's (_TRAIN_START_TIME): start-up, the model's
// build and the checkpoint's load included.
const Clock::time_point kProcessStart = Clock::now();
}  // namespace

void announce_load(const Config& cfg, const TrainState& state, bool loaded, bool lead) {
  if (!lead || !cfg.checkpoint.load) return;
  const auto& ck = cfg.checkpoint;
  if (!loaded) {
    std::cout << "megatrain: no checkpoint in " << *ck.load << " yet: starting from scratch\n";
    return;
  }
  const LoadOptions lo = load_options(cfg);
  if (lo.upcycle) {
    const MoeConfig& m = cfg.moe;
    std::cout << "megatrain: upcycled the dense model of " << checkpoint_path(*ck.load, ck.ckpt_step.value_or(latest_checkpoint(*ck.load).value_or(0)))
              << " into " << *m.num_experts << " experts" << (m.moe_upcycling_granularity > 1 ? " of 1/" + std::to_string(m.moe_upcycling_granularity) + " its MLP's width each" : std::string(" (copies of its MLP)"))
              << (lo.finetune ? " (--finetune: from sample 0)" : " (continuing its data after " + std::to_string(state.consumed_samples) + " samples)")
              << ": training from iteration " << state.iteration + 1 << " with fresh optimizer state and learning-rate schedule\n";
    return;
  }
  std::cout << "megatrain: loaded " << checkpoint_path(*ck.load, ck.ckpt_step.value_or(latest_checkpoint(*ck.load).value_or(0)))
            << (lo.finetune ? " (weights only, --finetune)" : "") << (!lo.load_optimizer && !lo.finetune ? " (without optimizer state)" : "")
            << ": continuing after iteration " << state.iteration << "\n";
}

TrainResult run_training_loop(const Config& cfg, const ProcessGroups& groups, TrainingEngine& engine, const TokenSource& data,
                              const TrainOptions& opt) {
  const bool lead = opt.rank == 0 && !opt.quiet;
  const int64_t mbs = *cfg.training.micro_batch_size, S = *cfg.data.seq_length;
  const int64_t nmb = cfg.derived.num_microbatches, gbs = cfg.derived.global_batch_size;
  const int64_t world = groups.world->size(), dp = groups.dp->size();
  const BatchSchedule batches(cfg, dp);
  const LrSchedule schedule(cfg), decoupled_schedule(cfg, true);
  const double flops_full_batch = flops_per_iteration(cfg);  // at the full global batch; per sample below
  auto flops_of = [&](int64_t batch) { return flops_full_batch * static_cast<double>(batch) / static_cast<double>(gbs); };
  const bool has_valid = data.has_split(Split::kValid) && cfg.logging.eval_iters > 0;
  const int64_t per_evaluation = cfg.logging.eval_iters * cfg.derived.eval_global_batch_size;  // samples of a split
  bool exited = false;  // by --exit-interval / --exit-duration-in-mins: no evaluations after the last iteration
  const auto& ck = cfg.checkpoint;
  // The run's length in iterations: fixed, or from --train-samples (under a batch-size ramp-up, Megatron's
  // count: the ramp's iterations, then whole full batches).
  const int64_t iters = cfg.training.train_iters ? *cfg.training.train_iters : batches.train_iterations(*cfg.training.train_samples);
  MetricsFile metrics(cfg, opt.rank, world);
  if (lead) {
    std::cout << "megatrain: data: " << data.describe() << "\n";
    for (const std::string& line : engine.describe()) std::cout << "megatrain: " << line << "\n";
    if (batches.stepping()) {
      std::cout << "megatrain: training " << iters << " iterations of " << S << "-token samples, the global batch from the step schedule \""
                << *cfg.training.step_batch_size_schedule << "\" (microbatches of " << mbs << "), world size " << world << "\n"
                << std::flush;
    } else {
      std::cout << "megatrain: training " << iters << " iterations of " << gbs << " samples x " << S << " tokens (" << nmb << " microbatches of "
                << mbs << " per data-parallel rank"
                << (batches.ramping() ? ", the batch ramped up from " + cfg.training.rampup_batch_size[0] : std::string()) << "), world size "
                << world << "\n"
                << std::flush;
    }
  }

  const TrainState resumed = engine.resumed();
  TrainResult res;
  res.model = engine.cpu_model();
  res.skipped = resumed.skipped;
  res.nan_iterations = resumed.nan_iterations;
  int64_t consumed = resumed.consumed_samples;  // samples consumed by the iterations stepped so far
  {  // (a step schedule's batches from here on: whole microbatches, a multiple of PP of them when interleaved)
    const auto& p = cfg.parallel;
    const bool interleaved = p.pipeline_model_parallel_size > 1 && virtual_stages_per_rank(cfg) > 1;
    batches.check_from(consumed, batches.samples_after(iters), interleaved ? p.pipeline_model_parallel_size : 1);
  }
  // The learning rate: the schedule's at the samples consumed since it started (an upcycled model's restarts).
  const int64_t lr_start = resumed.lr_schedule_start_samples;
  auto lr_at = [&](const LrSchedule& sch, int64_t samples) { return sch.lr_at_samples(samples - lr_start); };
  double flops_done = resumed.flops_so_far;
  int64_t nan_in_a_row = 0;
  std::string nan_exit;  // --exit-on-nan-count reached: the message
  // The iterations stepped and not yet read: their number, learning rate and batch.
  struct Pending {
    int64_t iteration;
    double lr;
  };
  std::vector<Pending> pending;
  // The interval being logged.
  double interval_loss = 0;
  std::vector<std::pair<std::string, double>> interval_moe;  // summed over the interval's good iterations
  std::vector<std::pair<std::string, std::vector<double>>> interval_moe_layers;  // (--moe-per-layer-logging) likewise, per layer
  double tokens_min = 0, tokens_mean = 0, tokens_max = 0, dropped = 0;
  int64_t moe_iters = 0;
  int64_t interval_ok = 0, interval_iters = 0, interval_samples = 0;
  double last_grad_norm = 0, last_lr = 0, last_num_zeros = -1;
  auto interval_start = Clock::now();
  double excluded_secs = 0;  // evaluation, checkpoints and logging inside the interval

  // Takes the reports of the pending iterations: losses, counts, and the exit on a run of non-finite steps.
  auto read = [&]() {
    const std::vector<StepReport> reports = engine.read_reports();
    if (reports.size() != pending.size()) throw std::logic_error("training loop: the engine reported another number of iterations");
    for (size_t i = 0; i < reports.size(); ++i) {
      const StepReport& r = reports[i];
      const bool loss_finite = std::isfinite(r.loss);
      res.losses.push_back(r.loss);
      res.grad_norms.push_back(r.grad_norm);
      if (cfg.logging.log_num_zeros_in_grad) res.num_zeros.push_back(r.num_zeros);
      if (!r.moe_losses.empty()) res.moe_losses.push_back(r.moe_losses);
      if (!r.moe_layer_losses.empty()) res.moe_layer_losses = r.moe_layer_losses;
      if (r.expert_tokens_min >= 0) {
        res.dropped_fraction.push_back(r.dropped_fraction);
        res.routing_digest.push_back(r.routing_digest);
      }
      if (r.skipped || !loss_finite) {
        // fp16 with a finite loss: an overflow, skipped as the scale shrinks; anything else non-finite is a NaN
        // iteration (no loss scale cures a non-finite loss).
        ++res.skipped;
        if (!(cfg.precision.fp16 && loss_finite)) ++res.nan_iterations;
      } else {  // as Megatron: the logged loss leaves skipped iterations out
        interval_loss += r.loss;
        ++interval_ok;
        if (interval_moe.size() != r.moe_losses.size()) {
          interval_moe = r.moe_losses;
        } else {
          for (size_t j = 0; j < interval_moe.size(); ++j) interval_moe[j].second += r.moe_losses[j].second;
        }
        if (interval_moe_layers.size() != r.moe_layer_losses.size()) {
          interval_moe_layers = r.moe_layer_losses;
        } else {
          for (size_t j = 0; j < interval_moe_layers.size(); ++j) {
            std::vector<double>& sum = interval_moe_layers[j].second;
            const std::vector<double>& add = r.moe_layer_losses[j].second;
            for (size_t l = 0; l < sum.size() && l < add.size(); ++l) sum[l] += add[l];
          }
        }
      }
      if (r.expert_tokens_min >= 0) {
        tokens_min += r.expert_tokens_min;
        tokens_mean += r.expert_tokens_mean;
        tokens_max += r.expert_tokens_max;
        dropped += r.dropped_fraction;
        ++moe_iters;
      }
      nan_in_a_row = !loss_finite || (r.skipped && !cfg.precision.fp16) ? nan_in_a_row + 1 : 0;
      if (nan_in_a_row >= cfg.training.exit_on_nan_count && nan_exit.empty()) {  // thrown once the interval is logged
        nan_exit = "loss or gradient norm was not finite for " + std::to_string(nan_in_a_row) + " iterations in a row (last at iteration " +
                   std::to_string(pending[i].iteration) + "): lower --lr, raise --lr-warmup-iters or check the data";
      }
      last_grad_norm = r.grad_norm;
      last_num_zeros = r.skipped || !loss_finite ? -1 : r.num_zeros;
      last_lr = pending[i].lr;
    }
    pending.clear();
  };

  // Megatron's upcycling saves the upcycled model before training (megatrain: as iteration 0, which the training continues).
  if (cfg.moe.moe_use_upcycling && ck.save) {
    engine.save(resumed);
    if (lead) std::cout << "megatrain: saved the upcycled model at iteration " << resumed.iteration << " to " << *ck.save << "\n" << std::flush;
  }
  if (lead && ck.load && ck.no_load_optim && !ck.finetune && !cfg.moe.moe_use_upcycling && resumed.iteration > 0) {
    std::cout << "megatrain: --no-load-optim: a fresh optimizer, and the learning-rate schedule (warmup included) starts again at "
                 "iteration " << resumed.iteration + 1 << ", as Megatron's\n" << std::flush;
  }
  const int64_t first_iter = resumed.iteration + 1;
  for (int64_t it = first_iter; it <= iters; ++it) {
    // The data position continues from the checkpoint's consumed samples (the batch size may differ).
    const int64_t base = consumed, batch = batches.global_batch(consumed), nmb_it = batch / (mbs * dp);
    // As Megatron's scheduler, stepped after each update: the update uses the rate of the samples consumed
    // before it (the first update the warmup's initial rate); the log shows the rate after it.
    engine.step(it, base, nmb_it, lr_at(schedule, base));
    consumed += batch;
    flops_done += flops_of(batch);
    interval_samples += batch;
    ++interval_iters;
    pending.push_back({it, lr_at(schedule, consumed)});
    res.iterations = it;
    // Megatron (since January 2026) also logs the run's first iteration, to show the start-up's cost, without ending the
    // interval: the next line still covers every iteration since the interval began. Where the first iteration also ends
    // an interval (--log-interval 1, or a resume one iteration before a log line) it ends it here; Megatron's should_reset
    // = not is_first_iteration keeps it open, so that its next line averages two iterations, which would make a resumed
    // run's log differ from the uninterrupted one's.
    const bool interval_end = it % cfg.logging.log_interval == 0 || it == iters;
    const bool logging = interval_end || it == first_iter;
    const bool evaluating = has_valid && it % cfg.logging.eval_interval == 0;
    bool out_of_time = false;  // --exit-duration-in-mins: on any rank, so that every rank stops at the same iteration (as Megatron)
    if (cfg.training.exit_duration_in_mins.value_or(0) > 0) {  // (0: off, as Megatron's falsy value)
      out_of_time = engine.any_rank(std::chrono::duration<double>(Clock::now() - kProcessStart).count() / 60.0 >
                                    static_cast<double>(*cfg.training.exit_duration_in_mins));
    }
    const bool exiting = out_of_time || (cfg.training.exit_interval && *cfg.training.exit_interval > 0 && it % *cfg.training.exit_interval == 0);
    const bool saving = ck.save && (it % *ck.save_interval == 0 || it == iters || exiting);
    if (engine.reports_each_step() || logging || evaluating || saving) read();
    const auto side_start = Clock::now();
    if (logging) {
      const double secs = std::chrono::duration<double>(side_start - interval_start).count() - excluded_secs;
      IterationStats s;
      s.iteration = it;
      s.train_iters = iters;
      s.consumed_samples = consumed;
      s.global_batch = batch;
      s.ms_per_iter = 1000.0 * secs / static_cast<double>(std::max<int64_t>(1, interval_iters));
      s.tflops_per_gpu = flops_of(interval_samples) / secs / static_cast<double>(world) / 1e12;
      s.loss = interval_ok ? interval_loss / static_cast<double>(interval_ok) : NAN;
      s.lr = last_lr;
      if (cfg.training.decoupled_lr) s.decoupled_lr = lr_at(decoupled_schedule, consumed);
      s.grad_norm = last_grad_norm;
      s.num_zeros = last_num_zeros;
      s.loss_scale = engine.loss_scale();  // after this step's update, as Megatron logs it
      res.loss_scale = s.loss_scale;
      s.skipped = res.skipped;
      s.nan_iters = res.nan_iterations;
      s.tokens_per_s_per_gpu = static_cast<double>(interval_samples * S) / secs / static_cast<double>(world);
      const double peak = engine.peak_tflops();
      s.mfu = peak > 0 ? s.tflops_per_gpu / peak : -1;
      if (cfg.logging.log_params_norm) s.params_norm = engine.params_norm();
      s.memory = engine.device_memory(it);
      for (const auto& [name, sum] : interval_moe) s.moe_losses.emplace_back(name, interval_ok ? sum / static_cast<double>(interval_ok) : NAN);
      for (auto [name, per_layer] : interval_moe_layers) {
        for (double& x : per_layer) x = interval_ok ? x / static_cast<double>(interval_ok) : NAN;
        s.moe_layer_losses.emplace_back(name, std::move(per_layer));
      }
      if (moe_iters > 0) {
        const double n = static_cast<double>(moe_iters);
        s.expert_tokens_min = tokens_min / n;
        s.expert_tokens_mean = tokens_mean / n;
        s.expert_tokens_max = tokens_max / n;
        s.dropped_fraction = dropped / n;
      }
      s.first_iteration = it == first_iter;
      if (lead) std::cout << format_iteration_line(s) << "\n" << std::flush;
      metrics.iteration(s);
    }
    if (interval_end) {
      interval_loss = 0;
      interval_ok = interval_iters = interval_samples = 0;
      interval_moe.clear();
      interval_moe_layers.clear();
      tokens_min = tokens_mean = tokens_max = dropped = 0;
      moe_iters = 0;
    }
    if (!nan_exit.empty()) throw std::runtime_error(nan_exit);
    if (evaluating) {  // (each evaluation continues the validation split where the last stopped, as Megatron's iterator)
      const double vl = engine.evaluate(it, Split::kValid, (it / cfg.logging.eval_interval - 1) * per_evaluation);
      res.valid_losses.push_back(vl);
      if (lead) std::cout << format_validation_line(it, vl) << "\n" << std::flush;
      metrics.validation(it, vl, consumed);
    }
    if (saving) {
      TrainState state;
      state.iteration = it;
      state.consumed_samples = consumed;
      state.lr_schedule_start_samples = lr_start;
      state.flops_so_far = flops_done;
      state.skipped = res.skipped;
      state.nan_iterations = res.nan_iterations;
      engine.save(state);
      if (lead) std::cout << "megatrain: " << (ck.async_save ? "saving" : "saved") << " checkpoint at iteration " << it << " to " << *ck.save << "\n" << std::flush;
    }
    if (interval_end) {  // the next interval starts now
      interval_start = Clock::now();
      excluded_secs = 0;
    } else {
      excluded_secs += std::chrono::duration<double>(Clock::now() - side_start).count();
    }
    if (exiting) {
      if (lead) std::cout << "megatrain: exiting at iteration " << it << (out_of_time ? " (--exit-duration-in-mins)\n" : " (--exit-interval)\n");
      exited = true;
      break;
    }
  }
  // After the last iteration (not after an exit), Megatron's pretrain evaluates once more on the validation split, after
  // every evaluation of the run so far, and once on the test split from its start.
  // (at the iteration the run stands at: --train-iters, or a checkpoint's beyond it, which trains nothing)
  const int64_t last = std::max(iters, resumed.iteration);
  if (!exited && has_valid) {
    const double vl = engine.evaluate(last, Split::kValid, (last / cfg.logging.eval_interval) * per_evaluation);
    res.valid_losses.push_back(vl);
    if (lead) std::cout << format_validation_line(last, vl, " on validation set") << "\n" << std::flush;
    metrics.validation(last, vl, consumed, true);
  }
  if (!exited && data.has_split(Split::kTest) && cfg.logging.eval_iters > 0) {
    const double tl = engine.evaluate(last, Split::kTest, 0);
    res.test_losses.push_back(tl);
    if (lead) std::cout << format_validation_line(last, tl, " on test set") << "\n" << std::flush;
    metrics.test(last, tl, consumed);
  }
  engine.finish();
  return res;
}

}  // namespace mt
