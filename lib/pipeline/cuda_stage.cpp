// cuda_stage.cpp: the CUDA stage's actions and its activation slots.
#include "pipeline/cuda_stage.h"

#include <stdexcept>
#include <string>

namespace mt {

CudaPipelineStage::CudaPipelineStage(CudaGPT& model, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc)
    : model_(model), stage_(std::move(stage_microbatch)), loss_acc_(loss_acc) {
  for (int64_t k = model.max_in_flight() - 1; k >= 0; --k) free_slots_.push_back(k);
}

void CudaPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  if (chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
  if (in_flight_.count(microbatch)) throw std::logic_error("the CUDA stage's microbatch " + std::to_string(microbatch) + " is already in flight");
  if (free_slots_.empty()) {
    throw std::logic_error("the schedule has more than " + std::to_string(model_.max_in_flight()) +
                           " microbatches in flight, more than the CUDA model holds activations for");
  }
  InFlight f{stage_(microbatch), free_slots_.back()};
  model_.forward(f.staged.mb, f.staged.grad_scale, f.staged.loss_weight, loss_acc_, f.slot);
  if (f.staged.grad_scale <= 0.0f) return;  // forward only: no backward will come
  free_slots_.pop_back();
  in_flight_.emplace(microbatch, f);
}

void CudaPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  if (chunk != 0 || !with_weights) throw std::logic_error("the CUDA stage holds one model chunk and runs its weight gradients with the backward");
  const auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) throw std::logic_error("the CUDA stage's backward of microbatch " + std::to_string(microbatch) + " has no forward before it");
  model_.set_final_backward(last);
  model_.backward(it->second.staged.mb, it->second.slot);
  free_slots_.push_back(it->second.slot);
  in_flight_.erase(it);
}

}  // namespace mt
