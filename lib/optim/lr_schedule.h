// lr_schedule.h: Megatron's learning-rate schedule: linear warmup from --lr-warmup-init, then
// constant, linear, cosine, inverse-square-root or WSD decay to --min-lr over --lr-decay-iters.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace mt {

class LrSchedule {
 public:
  explicit LrSchedule(const Config& cfg);
  // Learning rate of iteration `step` (1-based).
  double lr(int64_t step) const;
  int64_t warmup_steps() const { return warmup_; }
  int64_t decay_steps() const { return decay_; }

 private:
  double max_lr_, min_lr_, init_lr_;
  int64_t warmup_ = 0, decay_ = 0, wsd_decay_ = 0;
  std::string style_, wsd_style_;
};

}  // namespace mt
