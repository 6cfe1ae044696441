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
  bool dynamic() const { return dynamic_; }
  // Checkpointed state; `dynamic`: saved by a dynamic fp16 run (only such a state is restored).
  struct State {
    float scale;
    int64_t hysteresis_left, clean_steps;
    bool dynamic = false;
  };
  State state() const { return {scale_, hysteresis_left_, clean_steps_, dynamic_}; }
  // As Megatron: a static scale (or bf16 / fp32) keeps its own value; a dynamic scaler continues from a
  // dynamic run's state and otherwise starts at --initial-loss-scale.
  void restore(const State& s) {
    if (!dynamic_ || !s.dynamic) return;
    scale_ = s.scale;
    hysteresis_left_ = s.hysteresis_left;
    clean_steps_ = s.clean_steps % window_;  // older checkpoints counted clean steps past the window
  }

 private:
  bool dynamic_ = false;
  float scale_ = 1.0f, min_scale_ = 1.0f;
  int64_t window_ = 1000, hysteresis_ = 2, hysteresis_left_ = 2, clean_steps_ = 0;
};

}  // namespace mt
