// cpu_stage.h: the CPU engine's GPTModel as a pipeline stage: microbatches by index from the training data,
// their mean loss kept on the host.
#pragma once

#include <cstdint>
#include <functional>

#include "model/gpt_model.h"
#include "pipeline/stage.h"

namespace mt {

class CpuPipelineStage final : public PipelineStage {
 public:
  // get_microbatch(m): microbatch m of this iteration; grad_scale: the loss gradient's scale (loss scale / microbatches).
  CpuPipelineStage(GPTModel& model, std::function<Microbatch(int64_t)> get_microbatch, int64_t step, float grad_scale)
      : model_(model), get_(std::move(get_microbatch)), step_(step), grad_scale_(grad_scale) {}
  void forward(int64_t microbatch, int64_t chunk) override;
  void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) override;
  void backward_weights(int64_t microbatch, int64_t chunk) override;
  // The mean of the forwarded microbatches' losses (the last stage's).
  double mean_loss() const { return forwards_ ? loss_sum_ / static_cast<double>(forwards_) : 0.0; }

 private:
  GPTModel& model_;
  std::function<Microbatch(int64_t)> get_;
  int64_t step_;
  float grad_scale_;
  double loss_sum_ = 0;
  int64_t forwards_ = 0;
  static void one_chunk(int64_t chunk);
};

}  // namespace mt
