// stage.h: what a pipeline schedule drives, one engine's stage on this rank (its model chunks), by
// (microbatch, chunk). Each engine implements it over its model (pipeline/cpu_stage.h, pipeline/cuda_stage.h);
// the data of a microbatch, its losses and its activations stay with the engine.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "pipeline/schedule.h"

namespace mt {

class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual void forward(int64_t microbatch, int64_t chunk) = 0;
  // last: the iteration's last backward of this chunk (the per-layer reductions and the grads-ready hook run).
  // with_weights: the weight gradients too; else they wait for backward_weights.
  virtual void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) = 0;
  // last: the chunk's last weight-gradient pass of the iteration (the reductions and the hook that follow the
  // weight gradients run with it).
  virtual void backward_weights(int64_t microbatch, int64_t chunk, bool last) {
    (void)microbatch;
    (void)chunk;
    (void)last;
    throw std::logic_error("this engine's stage does not run its weight gradients apart");
  }
  // A run of consecutive transfers of the schedule (send / receive of activations or gradients at the stage
  // boundaries), posted together (Megatron's batched send_forward_recv_backward and the like: neighbours that
  // send to each other do not wait on each other). complete_exchange() waits for the batch; the executor calls
  // it before the next action that is not a weight-gradient pass (those need nothing from the neighbours and
  // run while the batch is in flight).
  virtual void exchange(const std::vector<ScheduleAction>& transfers) {
    (void)transfers;
    throw std::logic_error("this stage has no pipeline neighbours");
  }
  virtual void complete_exchange() {}
};

}  // namespace mt
