// lr_schedule.cpp: the OptimizerParamScheduler formulas.
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace mt {

LrSchedule::LrSchedule(const Config& c, bool decoupled) {
  const auto& t = c.training;
  max_lr_ = decoupled ? t.decoupled_lr.value_or(0.0) : t.lr.value_or(0.0);
  min_lr_ = decoupled ? t.decoupled_min_lr.value_or(t.min_lr) : t.min_lr;
  init_lr_ = t.lr_warmup_init;
  gbs_ = std::max<int64_t>(1, c.derived.global_batch_size);
  const int64_t total = t.train_iters ? *t.train_iters * gbs_ : t.train_samples.value_or(0);
  decay_ = t.lr_decay_samples ? *t.lr_decay_samples : t.lr_decay_iters ? *t.lr_decay_iters * gbs_ : total;
  warmup_ = t.lr_warmup_fraction ? static_cast<int64_t>(*t.lr_warmup_fraction * static_cast<double>(decay_)) : t.lr_warmup_iters * gbs_;
  if (t.lr_warmup_samples) warmup_ = *t.lr_warmup_samples;
  wsd_decay_ = t.lr_wsd_decay_iters.value_or(0) * gbs_;
  style_ = t.lr_decay_style;
  wsd_style_ = t.lr_wsd_decay_style;
}

double LrSchedule::lr_at_samples(int64_t step) const {
  if (warmup_ > 0 && step <= warmup_) {
    return init_lr_ + (max_lr_ - init_lr_) * static_cast<double>(step) / static_cast<double>(warmup_);
  }
  if (style_ == "constant") return max_lr_;
  if (step > decay_) return min_lr_;
  if (style_ == "inverse-square-root") {
    const double w = static_cast<double>(std::max<int64_t>(warmup_, 1));
    const double n = static_cast<double>(std::max<int64_t>(step, 1));
    return std::max(min_lr_, max_lr_ * std::sqrt(w) / std::sqrt(n));
  }
  const double span = static_cast<double>(std::max<int64_t>(1, decay_ - warmup_));
  const double ratio = std::clamp(static_cast<double>(step - warmup_) / span, 0.0, 1.0);
  double coeff = 1.0;
  if (style_ == "linear") {
    coeff = 1.0 - ratio;
  } else if (style_ == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else if (style_ == "WSD") {
    const int64_t anneal_start = decay_ - wsd_decay_;
    if (step <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = std::clamp(static_cast<double>(step - anneal_start) / static_cast<double>(std::max<int64_t>(1, wsd_decay_)), 0.0, 1.0);
      if (wsd_style_ == "linear") coeff = 1.0 - r;
      else if (wsd_style_ == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (wsd_style_ == "minus_sqrt") coeff = 1.0 - std::sqrt(r);
      else coeff = 2.0 * std::pow(0.5, r) - 1.0;  // exponential
    }
  }
  return min_lr_ + coeff * (max_lr_ - min_lr_);
}

}  // namespace mt
