// schedule.cpp: the no-pipelining schedule.
#include "pipeline/schedule.h"

namespace mt {

double forward_backward_no_pipelining(GPTModel& model, int64_t num_microbatches,
                                      const std::function<Microbatch(int64_t)>& get_microbatch, int64_t step,
                                      float grad_scale) {
  double sum = 0;
  for (int64_t m = 0; m < num_microbatches; ++m) {
    const Microbatch mb = get_microbatch(m);
    sum += model.forward(mb, step, true);
    model.backward(grad_scale);
  }
  return sum / static_cast<double>(num_microbatches);
}

}  // namespace mt
