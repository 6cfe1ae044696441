// cuda_stage.cpp: the CUDA stage's actions, its activation slots and its boundary transfers.
#include "pipeline/cuda_stage.h"

#include <stdexcept>
#include <string>

#include "tensor/cuda/device_allocator.h"

namespace mt {

StageBuffers::~StageBuffers() {
  for (void* p : all_) device_free(p);
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

CudaPipelineStage::CudaPipelineStage(std::vector<CudaGPT*> models, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc,
                                     StagePipeline pipeline)
    : models_(std::move(models)), stage_(std::move(stage_microbatch)), loss_acc_(loss_acc), pp_(pipeline) {
  if (models_.empty()) throw std::logic_error("CUDA stage: no model chunk");
  for (CudaGPT* m : models_) {
    free_slots_.emplace_back();
    for (int64_t k = m->max_in_flight() - 1; k >= 0; --k) free_slots_.back().push_back(k);
  }
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

CudaGPT& CudaPipelineStage::model(int64_t chunk) const {
  if (chunk < 0 || chunk >= static_cast<int64_t>(models_.size())) {
    throw std::logic_error("the CUDA stage holds " + std::to_string(models_.size()) + " model chunk(s), not chunk " + std::to_string(chunk));
  }
  return *models_[static_cast<size_t>(chunk)];
}

void* CudaPipelineStage::take_from(std::map<Key, void*>& from, Key key, const char* what) {
  const auto it = from.find(key);
  if (it == from.end()) {
    throw std::logic_error(std::string("CUDA stage: no ") + what + " for microbatch " + std::to_string(key.second) + " of chunk " + std::to_string(key.first));
  }
  void* p = it->second;
  from.erase(it);
  return p;
}

void CudaPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  CudaGPT& m = model(chunk);
  const Key key{chunk, microbatch};
  auto& free = free_slots_[static_cast<size_t>(chunk)];
  if (in_flight_.count(key)) throw std::logic_error("the CUDA stage's microbatch " + std::to_string(microbatch) + " is already in flight");
  if (free.empty()) {
    throw std::logic_error("the schedule has more than " + std::to_string(m.max_in_flight()) +
                           " microbatches in flight, more than the CUDA model holds activations for");
  }
  // Staged once for all the stage's chunks (its device buffers serve each chunk's forward and backward).
  auto st = staged_.find(microbatch);
  if (st == staged_.end()) st = staged_.emplace(microbatch, stage_(microbatch)).first;
  InFlight f{st->second, free.back()};
  void* input = m.pre_process() ? nullptr : take_from(inputs_, key, "received activations");
  void* output = m.post_process() ? nullptr : pp_.activations->take();
  m.forward(f.staged.mb, f.staged.grad_scale, f.staged.loss_weight, loss_acc_, f.slot, input, output);
  if (input) pp_.activations->give(input);  // read on the compute stream; later work there may reuse it
  if (output) outputs_[key] = output;
  if (f.staged.grad_scale <= 0.0f) return;  // forward only: no backward will come
  free.pop_back();
  in_flight_.emplace(key, f);
}

void CudaPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  CudaGPT& m = model(chunk);
  const Key key{chunk, microbatch};
  const auto it = in_flight_.find(key);
  if (it == in_flight_.end()) throw std::logic_error("the CUDA stage's backward of microbatch " + std::to_string(microbatch) + " has no forward before it");
  float* dy = m.post_process() ? nullptr : static_cast<float*>(take_from(output_grads_, key, "received gradient"));
  float* dx = m.pre_process() ? nullptr : static_cast<float*>(pp_.gradients->take());
  m.set_final_backward(last);
  m.backward(it->second.staged.mb, it->second.slot, dy, dx, !with_weights);
  if (dy) pp_.gradients->give(dy);
  if (dx) input_grads_[key] = dx;
  if (!with_weights) return;  // the slot stays with the microbatch until its weight gradients
  free_slots_[static_cast<size_t>(chunk)].push_back(it->second.slot);
  in_flight_.erase(it);
}

void CudaPipelineStage::backward_weights(int64_t microbatch, int64_t chunk, bool last) {
  CudaGPT& m = model(chunk);
  const auto it = in_flight_.find({chunk, microbatch});
  if (it == in_flight_.end()) throw std::logic_error("the CUDA stage's weight gradients of microbatch " + std::to_string(microbatch) + " have no backward");
  m.set_final_backward(last);
  m.backward_weights(it->second.staged.mb, it->second.slot);
  free_slots_[static_cast<size_t>(chunk)].push_back(it->second.slot);
  in_flight_.erase(it);
}

void CudaPipelineStage::exchange(const std::vector<ScheduleAction>& transfers) {
  if (pp_.size <= 1) throw std::logic_error("CUDA stage: transfers without a pipeline");
  if (posted_) throw std::logic_error("CUDA stage: a batch of transfers is already in flight");
  // The ring of virtual stages: the last rank's chunk c feeds the first rank's chunk c + 1.
  const int next = (pp_.rank + 1) % pp_.size, prev = (pp_.rank + pp_.size - 1) % pp_.size;
  std::vector<StageLink::Transfer> batch;
  for (const ScheduleAction& a : transfers) {
    const Key key{a.chunk, a.microbatch};
    switch (a.kind) {
      case ActionKind::kSendForward: {
        void* p = take_from(outputs_, key, "output to send");
        batch.push_back({true, p, pp_.activations->bytes(), next});
        sending_.emplace_back(pp_.activations, p);
        break;
      }
      case ActionKind::kSendBackward: {
        void* p = take_from(input_grads_, key, "input gradient to send");
        batch.push_back({true, p, pp_.gradients->bytes(), prev});
        sending_.emplace_back(pp_.gradients, p);
        break;
      }
      case ActionKind::kRecvForward:
        batch.push_back({false, inputs_[key] = pp_.activations->take(), pp_.activations->bytes(), prev});
        break;
      case ActionKind::kRecvBackward:
        batch.push_back({false, output_grads_[key] = pp_.gradients->take(), pp_.gradients->bytes(), next});
        break;
      default: throw std::logic_error("CUDA stage: " + action_name(a) + " is not a transfer");
    }
  }
  pp_.link->post(batch, models_.front()->stream());
  posted_ = true;
}

void CudaPipelineStage::complete_exchange() {
  if (!posted_) return;
  pp_.link->complete(models_.front()->stream());
  posted_ = false;
  for (auto& [pool, p] : sending_) pool->give(p);  // reused only by work queued after the wait
  sending_.clear();
}

}  // namespace mt
