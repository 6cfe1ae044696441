// loss_scaler.cpp: Megatron's DynamicGradScaler behaviour.
#include "optim/loss_scaler.h"

#include <algorithm>

namespace mt {

LossScaler::LossScaler(const Config& c) {
  if (!c.precision.fp16) return;
  if (c.precision.loss_scale) {
    scale_ = static_cast<float>(*c.precision.loss_scale);
    return;
  }
  dynamic_ = true;
  scale_ = static_cast<float>(c.precision.initial_loss_scale);
  min_scale_ = static_cast<float>(c.precision.min_loss_scale);
  window_ = c.precision.loss_scale_window;
  hysteresis_ = hysteresis_left_ = c.precision.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!overflow) {
    if (dynamic_ && ++clean_steps_ >= window_) {
      clean_steps_ = 0;
      scale_ *= 2.0f;
      hysteresis_left_ = hysteresis_;
    }
    return false;
  }
  if (dynamic_) {
    clean_steps_ = 0;
    // As Megatron: once the hysteresis is used up, every further overflow halves the scale; only a
    // growth (a clean window) restores it.
    if (--hysteresis_left_ <= 0) scale_ = std::max(min_scale_, scale_ / 2.0f);
  }
  return true;
}

}  // namespace mt
