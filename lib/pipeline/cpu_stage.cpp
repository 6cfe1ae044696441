// cpu_stage.cpp: the CPU stage's actions.
#include "pipeline/cpu_stage.h"

#include <stdexcept>

namespace mt {

void CpuPipelineStage::one_chunk(int64_t chunk) {
  if (chunk != 0) throw std::logic_error("the CPU stage holds one model chunk");
}

void CpuPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  one_chunk(chunk);
  loss_sum_ += model_.forward_stage(microbatch, get_(microbatch), step_, true, {}, nullptr);
  ++forwards_;
}

void CpuPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  one_chunk(chunk);
  model_.backward_stage(microbatch, grad_scale_, last, {}, nullptr, !with_weights);
}

void CpuPipelineStage::backward_weights(int64_t microbatch, int64_t chunk) {
  one_chunk(chunk);
  model_.backward_weights(microbatch);
}

}  // namespace mt
