// loss_scaler.h: fp16 loss scaling: static (--loss-scale) or dynamic (start at --initial-loss-scale,
// halve after --hysteresis overflowing steps, double after --loss-scale-window clean ones). bf16 and
// fp32 use a scale of 1.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

class LossScaler {
 public:
  explicit LossScaler(const Config& cfg);
  float scale() const { return scale_; }
  // Records whether this step's gradients overflowed; returns true when the step must be skipped.
  bool update(bool overflow);
  // Checkpointed state.
  struct State {
    float scale;
    int64_t hysteresis_left, clean_steps;
  };
  State state() const { return {scale_, hysteresis_left_, clean_steps_}; }
  void restore(const State& s) {
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    clean_steps_ = s.clean_steps;
  }

 private:
  bool dynamic_ = false;
  float scale_ = 1.0f, min_scale_ = 1.0f;
  int64_t window_ = 1000, hysteresis_ = 2, hysteresis_left_ = 2, clean_steps_ = 0;
};

}  // namespace mt
