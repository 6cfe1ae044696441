// schedule.cpp: the no-pipelining schedule.
#include "pipeline/schedule.h"

namespace mt {

double forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                      const std::function<Microbatch(int64_t)>& get_microbatch, int64_t step,
                                      float grad_scale, const std::function<void()>& before_last_backward) {
  double sum = 0;
  for (int64_t m = 0; m < num_microbatches; ++m) {
    const Microbatch mb = get_microbatch(m);
    sum += model.forward(mb, step, true);
    if (m == num_microbatches - 1 && before_last_backward) before_last_backward();
    model.backward(grad_scale, m == num_microbatches - 1);
  }
  return sum / static_cast<double>(num_microbatches);
}

}  // namespace mt
