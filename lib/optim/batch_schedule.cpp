// batch_schedule.cpp
#include "optim/batch_schedule.h"

#include <algorithm>
#include <string>

#include "config/errors.h"

namespace mt {

BatchSchedule::BatchSchedule(const Config& cfg, int64_t dp)
    : full_(cfg.derived.global_batch_size),
      max_(full_),
      mbs_(std::max<int64_t>(1, cfg.training.micro_batch_size.value_or(1))),
      dp_(std::max<int64_t>(1, dp)),
      seq_(cfg.data.seq_length.value_or(0)) {
  if (cfg.training.step_batch_size_schedule) {  // (validated: parses)
    steps_ = parse_batch_steps(*cfg.training.step_batch_size_schedule, seq_);
    max_ = 0;
    for (const BatchStep& s : steps_) max_ = std::max(max_, s.batch);
    return;
  }
  const auto& r = cfg.training.rampup_batch_size;
  if (r.size() != 3) return;  // validated: three integers
  start_ = std::stoll(r[0]);
  increment_ = std::stoll(r[1]);
  ramp_samples_ = std::stoll(r[2]);
  increments_ = increment_ > 0 ? (full_ - start_) / increment_ : 0;
}

int64_t BatchSchedule::global_batch(int64_t consumed) const {
  if (!steps_.empty()) {
    int64_t batch = steps_.front().batch;
    for (const BatchStep& s : steps_) {
      if (consumed < s.from_samples) break;
      batch = s.batch;
    }
    return batch;
  }
  if (increments_ <= 0 || consumed > ramp_samples_) return full_;
  // Megatron: steps = int(consumed / (ramp_samples / increments)), in floating point.
  const double per_increment = static_cast<double>(ramp_samples_) / static_cast<double>(increments_);
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(full_, start_ + steps * increment_);
}

int64_t BatchSchedule::train_iterations(int64_t train_samples) const {
  if (!steps_.empty()) {  // (Megatron's loop: while consumed < train_samples)
    int64_t iterations = 0;
    for (int64_t consumed = 0; consumed < train_samples; ++iterations) consumed += global_batch(consumed);
    return iterations;
  }
  if (!ramping()) return train_samples / full_;
  int64_t iterations = 0, consumed = 0;
  while (consumed <= ramp_samples_ && consumed <= train_samples) {
    consumed += global_batch(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / full_;
  return iterations;
}

int64_t BatchSchedule::samples_after(int64_t iterations) const {
  if (!ramping() && steps_.empty()) return iterations * full_;
  int64_t consumed = 0;
  for (int64_t i = 0; i < iterations; ++i) consumed += global_batch(consumed);
  return consumed;
}

void BatchSchedule::check_from(int64_t consumed, int64_t end, int64_t pp_multiple) const {
  const int64_t unit = mbs_ * dp_ * std::max<int64_t>(1, pp_multiple);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const bool passed = i + 1 < steps_.size() && steps_[i + 1].from_samples <= consumed;
    const bool unreached = i > 0 && steps_[i].from_samples >= end;
    if (passed || unreached || steps_[i].batch % unit == 0) continue;
    const std::string from = seq_ > 0 ? std::to_string(steps_[i].from_samples * seq_) + " tokens" : std::to_string(steps_[i].from_samples) + " samples";
    throw ConfigError("--step-batch-size-schedule: the batch size " + std::to_string(steps_[i].batch) + " (from " + from +
                      " on) is not a multiple of micro-batch-size x DP" + (pp_multiple > 1 ? " x PP (interleaved)" : "") + " = " +
                      std::to_string(unit) + ": make each batch size the run reaches a multiple of " + std::to_string(unit));
  }
}

}  // namespace mt
