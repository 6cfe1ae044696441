// overlapped_step.h: the optimizer step overlapped with the next forward (MEGATRAIN_OVERLAP_OPTIMIZER=1, an
// experiment, not with the distributed optimizer, which overlaps its parameter gather instead). After the
// gradient norm and the step's decisions (clip, skip) on the compute stream, the update runs on a stream
// of its own, bucket by bucket in the order the forward reads the parameters, each bucket's gradients
// zeroed behind its update (the next iteration's zeroing); the next forward waits, block by block, only
// for the buckets it reads. The arithmetic is the same as the step on the compute stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace mt {

class OverlappedStep {
 public:
  // bounds: flat offsets at which the forward starts reading new parameters (the embedding's end, each
  // layer's end, ...); with 0 and numel they cut [0, numel) into buckets. chunk_starts: the optimizer
  // table's chunks' flat starts, ascending.
  OverlappedStep(std::vector<int64_t> bounds, int64_t numel, const std::vector<int64_t>& chunk_starts);
  ~OverlappedStep();
  OverlappedStep(const OverlappedStep&) = delete;
  OverlappedStep& operator=(const OverlappedStep&) = delete;
  // After the work queued on `compute` (the step's decisions): update(first, count, stream) for each
  // bucket's chunks [first, first + count) on the step's stream, then the bucket's gradients zeroed.
  void launch(cudaStream_t compute, float* grads, const std::function<void(int64_t first, int64_t count, cudaStream_t s)>& update);
  // The compute stream waits for the buckets holding flat offsets below `end` (INT64_MAX: all).
  void wait(cudaStream_t compute, int64_t end);
  // Whether a launch has run: every gradient is then zeroed behind its update (the next iteration need not).
  bool zeroed() const { return launched_; }

 private:
  struct Bucket {
    int64_t lo, hi, first, count;  // flat range; the chunks of the table in it
  };
  std::vector<Bucket> buckets_;  // ascending
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::vector<cudaEvent_t> done_;
  size_t waited_ = 0, pending_ = 0;
  bool launched_ = false;
};

}  // namespace mt
