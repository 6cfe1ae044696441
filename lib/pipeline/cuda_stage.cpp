// cuda_stage.cpp: the CUDA stage's actions.
#include "pipeline/cuda_stage.h"

#include <stdexcept>
#include <string>

namespace mt {

void CudaPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  if (chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
  if (current_id_ >= 0) throw std::logic_error("the CUDA stage runs one microbatch at a time: microbatch " + std::to_string(current_id_) + "'s backward is due");
  current_ = stage_(microbatch);
  model_.forward(current_.mb, current_.grad_scale, current_.loss_weight, loss_acc_);
  if (current_.grad_scale > 0.0f) current_id_ = microbatch;
}

void CudaPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  if (chunk != 0 || !with_weights) throw std::logic_error("the CUDA stage holds one model chunk and runs its weight gradients with the backward");
  if (microbatch != current_id_) throw std::logic_error("the CUDA stage's backward of microbatch " + std::to_string(microbatch) + " does not follow its forward");
  model_.set_final_backward(last);
  model_.backward(current_.mb);
  current_id_ = -1;
}

}  // namespace mt
