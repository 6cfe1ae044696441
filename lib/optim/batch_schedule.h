// batch_schedule.h: the global batch size of each iteration: --global-batch-size; under
// --rampup-batch-size <start> <increment> <samples> Megatron's ramp-up (its
// RampupBatchsizeNumMicroBatchesCalculator): start + increment x floor(consumed / (samples / increments))
// until `samples` samples have been consumed, then the full size; or under --step-batch-size-schedule the
// batch of the last step whose threshold the consumed samples have reached (its
// StepBatchsizeNumMicroBatchesCalculator, config/batch_steps.h). A pure function of the consumed samples, so
// a resumed run continues where it stopped.
#pragma once

#include <cstdint>
#include <vector>

#include "config/batch_steps.h"
#include "config/config.h"

namespace mt {

class BatchSchedule {
 public:
  // cfg resolved (derived.global_batch_size set); dp: the data-parallel size.
  BatchSchedule(const Config& cfg, int64_t dp);
  int64_t global_batch(int64_t consumed_samples) const;
  // Microbatches per data-parallel rank for that global batch.
  int64_t microbatches(int64_t consumed_samples) const { return global_batch(consumed_samples) / (mbs_ * dp_); }
  int64_t max_global_batch() const { return max_; }
  bool ramping() const { return increments_ > 0; }
  bool stepping() const { return !steps_.empty(); }
  // The run's iterations for --train-samples, as Megatron's update_train_iters: the ramp's iterations while
  // the consumed samples are within the ramp and the run, then whole full batches (a partial last batch is
  // dropped); under a step schedule, iterations until the consumed samples reach train_samples (the last may
  // pass it).
  int64_t train_iterations(int64_t train_samples) const;
  // Samples consumed by the first `iterations` iterations.
  int64_t samples_after(int64_t iterations) const;
  // A step schedule's batch in effect at `consumed` samples and every later one the run reaches before `end` samples,
  // split into whole microbatches of micro-batch x DP (and, interleaved, a multiple of PP of them): else a ConfigError
  // naming the entry, before the run starts (Megatron asserts it when the batch comes into effect).
  void check_from(int64_t consumed, int64_t end, int64_t pp_multiple) const;

 private:
  int64_t full_ = 0, max_ = 0, start_ = 0, increment_ = 0, ramp_samples_ = 0, increments_ = 0, mbs_ = 1, dp_ = 1, seq_ = 0;
  std::vector<BatchStep> steps_;
};

}  // namespace mt
