// cpu_stage.h: the CPU engine's GPTModel as a pipeline stage (its model chunks): microbatches by index from
// the training data, each one's loss kept on the host (the last virtual stage's), and the activations and
// gradients at the virtual stage boundaries sent to and received from the neighbouring ranks over the
// pipeline group (the model's [Tl, h] residual-stream rows, a size known in advance; with interleaving the
// last rank's chunk c feeds the first rank's chunk c + 1, so the neighbours form a ring).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "pipeline/stage.h"

namespace mt {

class CpuPipelineStage final : public PipelineStage {
 public:
  // get_microbatch(m): microbatch m of this iteration; grad_scale: the loss gradient's scale (loss scale / microbatches).
  // pipeline: the pipeline-parallel group (its rank is this stage), with the microbatches' size for the
  // boundary transfers; training: false runs forwards only (evaluation).
  CpuPipelineStage(GPTModel& model, std::function<Microbatch(int64_t)> get_microbatch, int64_t step, float grad_scale,
                   Communicator* pipeline = nullptr, int64_t micro_batch_size = 0, bool training = true);
  void forward(int64_t microbatch, int64_t chunk) override;
  void backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) override;
  void backward_weights(int64_t microbatch, int64_t chunk, bool last) override;
  void exchange(const std::vector<ScheduleAction>& transfers) override;
  void complete_exchange() override;
  // Each forwarded microbatch's loss by its index (the last stage's; none on the others).
  const std::vector<std::pair<int64_t, double>>& losses() const { return losses_; }

 private:
  GPTModel& model_;
  std::function<Microbatch(int64_t)> get_;
  int64_t step_;
  float grad_scale_;
  Communicator* pipeline_;
  int64_t micro_batch_size_;
  bool training_;
  std::vector<std::pair<int64_t, double>> losses_;
  // By (chunk, microbatch): the activations received for the forward, the forward's output to send, the
  // gradient received for the backward, and the input gradient to send.
  using Key = std::pair<int64_t, int64_t>;
  std::map<Key, GPTModel::Activations> inputs_, outputs_, output_grads_, input_grads_;
  // The batch in flight, and the buffers it sends (released when it completes).
  std::unique_ptr<CommRequest> pending_;
  std::vector<std::pair<std::map<Key, GPTModel::Activations>*, Key>> sending_;
};

}  // namespace mt
