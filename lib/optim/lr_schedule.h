// lr_schedule.h: Megatron's learning-rate schedule: linear warmup from --lr-warmup-init, then
// constant, linear, cosine, inverse-square-root or WSD decay to --min-lr over --lr-decay-iters.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace mt {

// Counted in samples, as Megatron's OptimizerParamScheduler: iteration-based flags are scaled by the global
// batch size, and the rate after a step is a function of the samples consumed with it (which is what a
// batch-size ramp-up needs; with a fixed batch, lr(step) is the same as counting iterations).
class LrSchedule {
 public:
  // decoupled: the schedule of the input embedding and output layer weights under --decoupled-lr (its peak, and
  // --decoupled-min-lr or --min-lr at the end; warmup and decay as the others').
  explicit LrSchedule(const Config& cfg, bool decoupled = false);
  // Learning rate of iteration `step` (1-based) at the fixed global batch size.
  double lr(int64_t step) const { return lr_at_samples(step * gbs_); }
  // Learning rate once `samples` samples have been consumed: the rate of the next update, as Megatron's
  // scheduler (stepped after each update; the first update has lr_at_samples(0)), and the rate Megatron logs
  // for the iteration that consumed them.
  double lr_at_samples(int64_t samples) const;
  int64_t warmup_steps() const { return warmup_ / gbs_; }
  int64_t decay_steps() const { return decay_ / gbs_; }
  // What Megatron's OptimizerParamScheduler keeps in a checkpoint and checks at a load: the schedule in samples.
  struct Settings {
    double max_lr = 0, min_lr = 0;
    int64_t warmup_samples = 0, decay_samples = 0;
    std::string style;
  };
  Settings settings() const { return {max_lr_, min_lr_, warmup_, decay_, style_}; }

 private:
  double max_lr_, min_lr_, init_lr_;
  int64_t gbs_ = 1, warmup_ = 0, decay_ = 0, wsd_decay_ = 0;  // samples
  std::string style_, wsd_style_;
};

}  // namespace mt
