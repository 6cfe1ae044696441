// cuda_stage.h: the CUDA engine's model as a pipeline stage. Microbatches come staged on the device with their
// loss weights; the losses accumulate on the device (read at log intervals). Up to the model's max_in_flight()
// microbatches may be forwarded before their backwards, each in its own activation slot. Between stages
// (PP > 1) the boundary activations and gradients go over a StageLink from device buffers kept in a
// StageBuffers pool that outlives the iteration (no allocation per step); one model chunk per rank. A backward
// without its weight gradients (B of a zero-bubble schedule) keeps the microbatch's slot until its W.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "model/cuda/gpt_cuda.h"
#include "pipeline/stage.h"
#include "pipeline/stage_link.h"

namespace mt {

// Device buffers of one size, taken and given back; freed with the pool (after the device is idle).
class StageBuffers {
 public:
  explicit StageBuffers(size_t bytes) : bytes_(bytes) {}
  ~StageBuffers();
  StageBuffers(const StageBuffers&) = delete;
  StageBuffers& operator=(const StageBuffers&) = delete;
  void* take();
  void give(void* p) { free_.push_back(p); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  std::vector<void*> free_, all_;
};

// The neighbours of a CUDA pipeline stage: the link, this rank and the pipeline's size, and the pools of the
// boundary activations and gradients (the model's boundary_*_bytes of a microbatch).
struct StagePipeline {
  StageLink* link = nullptr;
  int rank = 0, size = 1;
  StageBuffers *activations = nullptr, *gradients = nullptr;
};

class CudaPipelineStage final : public PipelineStage {
 public:
  struct Staged {
    DeviceMicrobatch mb;
    float grad_scale = 0;   // the loss gradient's scale (0: forward only)
    float loss_weight = 0;  // loss_acc += loss_weight * the sum of the masked token losses
  };
  // stage_microbatch(m): microbatch m on the device; its buffers must live until m's last backward. models:
  // the stage's model chunks (virtual stages chunk x PP + rank), sharing one parameter buffer.
  CudaPipelineStage(std::vector<CudaGPT*> models, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc, StagePipeline pipeline = {});
  CudaPipelineStage(CudaGPT& model, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc, StagePipeline pipeline = {})
      : CudaPipelineStage(std::vector<CudaGPT*>{&model}, std::move(stage_microbatch), loss_acc, pipeline) {}
  ~CudaPipelineStage() override;
  void forward(int64_t microbatch, int64_t chunk) override;
  void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) override;
  void backward_weights(int64_t microbatch, int64_t chunk, bool last) override;
  void exchange(const std::vector<ScheduleAction>& transfers) override;
  void complete_exchange() override;

 private:
  struct InFlight {
    Staged staged;
    int64_t slot = 0;
  };
  using Key = std::pair<int64_t, int64_t>;  // (chunk, microbatch)
  std::vector<CudaGPT*> models_;
  std::function<Staged(int64_t)> stage_;
  float* loss_acc_;
  StagePipeline pp_;
  std::map<Key, InFlight> in_flight_;             // forwarded, backward (or W) due
  std::vector<std::vector<int64_t>> free_slots_;  // per chunk
  std::map<int64_t, Staged> staged_;              // per microbatch, staged at its first forward
  // By (chunk, microbatch): the activations received for the forward, the forward's output to send, the
  // gradient received for the backward, the input gradient to send (device buffers from the pools).
  std::map<Key, void*> inputs_, outputs_, output_grads_, input_grads_;
  // The batch in flight: the buffers it sends, given back to their pools once it completes.
  std::vector<std::pair<StageBuffers*, void*>> sending_;
  bool posted_ = false;
  CudaGPT& model(int64_t chunk) const;
  void* take_from(std::map<Key, void*>& from, Key key, const char* what);
};

}  // namespace mt
