// cuda_stage.h: the CUDA engine's model as a pipeline stage. Microbatches come staged on the device with their
// loss weights; the losses accumulate on the device (read at log intervals). One microbatch in flight (the
// model keeps one set of activation buffers): schedules beyond no-pipelining need the per-microbatch stash.
#pragma once

#include <cstdint>
#include <functional>

#include "model/cuda/gpt_cuda.h"
#include "pipeline/stage.h"

namespace mt {

class CudaPipelineStage final : public PipelineStage {
 public:
  struct Staged {
    DeviceMicrobatch mb;
    float grad_scale = 0;   // the loss gradient's scale (0: forward only)
    float loss_weight = 0;  // loss_acc += loss_weight * the sum of the masked token losses
  };
  CudaPipelineStage(CudaGPT& model, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc)
      : model_(model), stage_(std::move(stage_microbatch)), loss_acc_(loss_acc) {}
  void forward(int64_t microbatch, int64_t chunk) override;
  void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) override;

 private:
  CudaGPT& model_;
  std::function<Staged(int64_t)> stage_;
  float* loss_acc_;
  Staged current_;
  int64_t current_id_ = -1;  // the microbatch forwarded, its backward due
};

}  // namespace mt
