// batch_schedule.cpp
#include "optim/batch_schedule.h"

#include <algorithm>
#include <string>

namespace mt {

BatchSchedule::BatchSchedule(const Config& cfg, int64_t dp)
    : full_(cfg.derived.global_batch_size), mbs_(std::max<int64_t>(1, cfg.training.micro_batch_size.value_or(1))), dp_(std::max<int64_t>(1, dp)) {
  const auto& r = cfg.training.rampup_batch_size;
  if (r.size() != 3) return;  // validated: three integers
  start_ = std::stoll(r[0]);
  increment_ = std::stoll(r[1]);
  ramp_samples_ = std::stoll(r[2]);
  increments_ = increment_ > 0 ? (full_ - start_) / increment_ : 0;
}

int64_t BatchSchedule::global_batch(int64_t consumed) const {
  if (increments_ <= 0 || consumed > ramp_samples_) return full_;
  // Megatron: steps = int(consumed / (ramp_samples / increments)), in floating point.
  const double per_increment = static_cast<double>(ramp_samples_) / static_cast<double>(increments_);
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(full_, start_ + steps * increment_);
}

int64_t BatchSchedule::train_iterations(int64_t train_samples) const {
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
  if (!ramping()) return iterations * full_;
  int64_t consumed = 0;
  for (int64_t i = 0; i < iterations; ++i) consumed += global_batch(consumed);
  return consumed;
}

}  // namespace mt
