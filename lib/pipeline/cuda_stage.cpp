// cuda_stage.cpp: the CUDA stage's actions, its activation slots and its boundary transfers.
#include "pipeline/cuda_stage.h"

#include <stdexcept>
#include <string>

#include "tensor/cuda/device_allocator.h"

namespace mt {

StageBuffers::~StageBuffers() {
  for (void* p : all_) cudaFree(p);
}

void* StageBuffers::take() {
  if (free_.empty()) {
    all_.push_back(device_malloc(bytes_, "the pipeline's boundary activations and gradients"));
    return all_.back();
  }
  void* p = free_.back();
  free_.pop_back();
  return p;
}

CudaPipelineStage::CudaPipelineStage(CudaGPT& model, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc, StagePipeline pipeline)
    : model_(model), stage_(std::move(stage_microbatch)), loss_acc_(loss_acc), pp_(pipeline) {
  for (int64_t k = model.max_in_flight() - 1; k >= 0; --k) free_slots_.push_back(k);
  if (pp_.size > 1 && (!pp_.link || !pp_.activations || !pp_.gradients)) throw std::logic_error("CUDA stage: a pipeline without its link or buffers");
}

// Every buffer goes back to its pool (the schedule consumed them all; after an exception, whatever is left).
CudaPipelineStage::~CudaPipelineStage() {
  for (auto* m : {&inputs_, &outputs_}) {
    for (auto& [k, p] : *m) pp_.activations->give(p);
  }
  for (auto* m : {&output_grads_, &input_grads_}) {
    for (auto& [k, p] : *m) pp_.gradients->give(p);
  }
  for (auto& [pool, p] : sending_) pool->give(p);
}

void* CudaPipelineStage::take_from(std::map<int64_t, void*>& from, int64_t m, const char* what) {
  const auto it = from.find(m);
  if (it == from.end()) throw std::logic_error(std::string("CUDA stage: no ") + what + " for microbatch " + std::to_string(m));
  void* p = it->second;
  from.erase(it);
  return p;
}

void CudaPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  if (chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
  if (in_flight_.count(microbatch)) throw std::logic_error("the CUDA stage's microbatch " + std::to_string(microbatch) + " is already in flight");
  if (free_slots_.empty()) {
    throw std::logic_error("the schedule has more than " + std::to_string(model_.max_in_flight()) +
                           " microbatches in flight, more than the CUDA model holds activations for");
  }
  InFlight f{stage_(microbatch), free_slots_.back()};
  void* input = model_.pre_process() ? nullptr : take_from(inputs_, microbatch, "received activations");
  void* output = model_.post_process() ? nullptr : pp_.activations->take();
  model_.forward(f.staged.mb, f.staged.grad_scale, f.staged.loss_weight, loss_acc_, f.slot, input, output);
  if (input) pp_.activations->give(input);  // read on the compute stream; later work there may reuse it
  if (output) outputs_[microbatch] = output;
  if (f.staged.grad_scale <= 0.0f) return;  // forward only: no backward will come
  free_slots_.pop_back();
  in_flight_.emplace(microbatch, f);
}

void CudaPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  if (chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
  const auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) throw std::logic_error("the CUDA stage's backward of microbatch " + std::to_string(microbatch) + " has no forward before it");
  float* dy = model_.post_process() ? nullptr : static_cast<float*>(take_from(output_grads_, microbatch, "received gradient"));
  float* dx = model_.pre_process() ? nullptr : static_cast<float*>(pp_.gradients->take());
  model_.set_final_backward(last);
  model_.backward(it->second.staged.mb, it->second.slot, dy, dx, !with_weights);
  if (dy) pp_.gradients->give(dy);
  if (dx) input_grads_[microbatch] = dx;
  if (!with_weights) return;  // the slot stays with the microbatch until its weight gradients
  free_slots_.push_back(it->second.slot);
  in_flight_.erase(it);
}

void CudaPipelineStage::backward_weights(int64_t microbatch, int64_t chunk, bool last) {
  if (chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
  const auto it = in_flight_.find(microbatch);
  if (it == in_flight_.end()) throw std::logic_error("the CUDA stage's weight gradients of microbatch " + std::to_string(microbatch) + " have no backward");
  model_.set_final_backward(last);
  model_.backward_weights(it->second.staged.mb, it->second.slot);
  free_slots_.push_back(it->second.slot);
  in_flight_.erase(it);
}

void CudaPipelineStage::exchange(const std::vector<ScheduleAction>& transfers) {
  if (pp_.size <= 1) throw std::logic_error("CUDA stage: transfers without a pipeline");
  if (posted_) throw std::logic_error("CUDA stage: a batch of transfers is already in flight");
  const int next = (pp_.rank + 1) % pp_.size, prev = (pp_.rank + pp_.size - 1) % pp_.size;
  std::vector<StageLink::Transfer> batch;
  for (const ScheduleAction& a : transfers) {
    if (a.chunk != 0) throw std::logic_error("the CUDA stage holds one model chunk");
    switch (a.kind) {
      case ActionKind::kSendForward: {
        void* p = take_from(outputs_, a.microbatch, "output to send");
        batch.push_back({true, p, pp_.activations->bytes(), next});
        sending_.emplace_back(pp_.activations, p);
        break;
      }
      case ActionKind::kSendBackward: {
        void* p = take_from(input_grads_, a.microbatch, "input gradient to send");
        batch.push_back({true, p, pp_.gradients->bytes(), prev});
        sending_.emplace_back(pp_.gradients, p);
        break;
      }
      case ActionKind::kRecvForward:
        batch.push_back({false, inputs_[a.microbatch] = pp_.activations->take(), pp_.activations->bytes(), prev});
        break;
      case ActionKind::kRecvBackward:
        batch.push_back({false, output_grads_[a.microbatch] = pp_.gradients->take(), pp_.gradients->bytes(), next});
        break;
      default: throw std::logic_error("CUDA stage: " + action_name(a) + " is not a transfer");
    }
  }
  pp_.link->post(batch, model_.stream());
  posted_ = true;
}

void CudaPipelineStage::complete_exchange() {
  if (!posted_) return;
  pp_.link->complete(model_.stream());
  posted_ = false;
  for (auto& [pool, p] : sending_) pool->give(p);  // reused only by work queued after the wait
  sending_.clear();
}

}  // namespace mt
