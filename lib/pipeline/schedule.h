// schedule.h: pipeline schedules. The "no pipelining" schedule runs every microbatch's forward and
// backward in turn on one stage; 1F1B and interleaved schedules replace it when PP > 1.
#pragma once

#include <cstdint>
#include <functional>

#include "model/gpt_model.h"

namespace mt {

// Returns the mean loss over the microbatches; gradients of loss * grad_scale accumulate.
// before_last_backward runs before the last microbatch's backward (data parallel arms its gradient
// reduction there, so buckets launch while that backward runs).
double forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                      const std::function<Microbatch(int64_t)>& get_microbatch, int64_t step,
                                      float grad_scale, const std::function<void()>& before_last_backward = {});

}  // namespace mt
