// batch_schedule.h: the global batch size of each iteration: --global-batch-size, or under
// --rampup-batch-size <start> <increment> <samples> Megatron's ramp-up (its
// RampupBatchsizeNumMicroBatchesCalculator): start + increment x floor(consumed / (samples / increments))
// until `samples` samples have been consumed, then the full size. A pure function of the consumed samples,
// so a resumed run continues the ramp where it stopped.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

class BatchSchedule {
 public:
  // cfg resolved (derived.global_batch_size set); dp: the data-parallel size.
  BatchSchedule(const Config& cfg, int64_t dp);
  int64_t global_batch(int64_t consumed_samples) const;
  // Microbatches per data-parallel rank for that global batch.
  int64_t microbatches(int64_t consumed_samples) const { return global_batch(consumed_samples) / (mbs_ * dp_); }
  int64_t max_global_batch() const { return full_; }
  bool ramping() const { return increments_ > 0; }
  // The run's iterations for --train-samples, as Megatron's update_train_iters: the ramp's iterations while
  // the consumed samples are within the ramp and the run, then whole full batches (a partial last batch is
  // dropped).
  int64_t train_iterations(int64_t train_samples) const;
  // Samples consumed by the first `iterations` iterations.
  int64_t samples_after(int64_t iterations) const;

 private:
  int64_t full_ = 0, start_ = 0, increment_ = 0, ramp_samples_ = 0, increments_ = 0, mbs_ = 1, dp_ = 1;
};

}  // namespace mt
