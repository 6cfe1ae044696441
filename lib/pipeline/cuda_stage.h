// cuda_stage.h: the CUDA engine's model as a pipeline stage. Microbatches come staged on the device with their
// loss weights; the losses accumulate on the device (read at log intervals). Up to the model's max_in_flight()
// microbatches may be forwarded before their backwards, each in its own activation slot.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

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
  // stage_microbatch(m): microbatch m on the device; its buffers must live until m's backward.
  CudaPipelineStage(CudaGPT& model, std::function<Staged(int64_t)> stage_microbatch, float* loss_acc);
  void forward(int64_t microbatch, int64_t chunk) override;
  void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) override;

 private:
  struct InFlight {
    Staged staged;
    int64_t slot = 0;
  };
  CudaGPT& model_;
  std::function<Staged(int64_t)> stage_;
  float* loss_acc_;
  std::map<int64_t, InFlight> in_flight_;  // forwarded, backward due
  std::vector<int64_t> free_slots_;
};

}  // namespace mt
