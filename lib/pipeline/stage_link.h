// stage_link.h: how the CUDA engine's pipeline stages reach their neighbours. A batch of sends and receives
// of device buffers (the activations and gradients at the stage boundaries) is posted after the work queued
// so far on the compute stream and runs on the link's own stream, overlapping the compute that follows;
// complete() makes the compute stream wait for it (no host wait). NcclStageLink goes over the pipeline
// group's NCCL communicator; a test links two stages of one process.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace mt {

class StreamCollectives;

class StageLink {
 public:
  struct Transfer {
    bool send = true;
    void* data = nullptr;
    size_t bytes = 0;
    int peer = 0;  // rank in the pipeline group
  };
  virtual ~StageLink() = default;
  // Posts one batch (the sends and receives between two ranks meet in the order posted).
  virtual void post(const std::vector<Transfer>& batch, cudaStream_t compute) = 0;
  // The compute stream waits for the batch posted last; its buffers may be reused by work queued after this.
  virtual void complete(cudaStream_t compute) = 0;
};

// Over the pipeline group's NCCL communicator, on a stream of its own.
class NcclStageLink final : public StageLink {
 public:
  explicit NcclStageLink(StreamCollectives& pipeline);
  ~NcclStageLink() override;
  NcclStageLink(const NcclStageLink&) = delete;
  NcclStageLink& operator=(const NcclStageLink&) = delete;
  void post(const std::vector<Transfer>& batch, cudaStream_t compute) override;
  void complete(cudaStream_t compute) override;

 private:
  StreamCollectives& pipeline_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
};

}  // namespace mt
