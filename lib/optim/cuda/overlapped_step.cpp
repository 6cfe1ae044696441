// overlapped_step.cpp
#include "optim/cuda/overlapped_step.h"

#include <algorithm>
#include <stdexcept>

#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

OverlappedStep::OverlappedStep(std::vector<int64_t> bounds, int64_t numel, const std::vector<int64_t>& chunk_starts) {
  bounds.push_back(0);
  bounds.push_back(numel);
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  size_t c = 0;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    Bucket b{bounds[i], bounds[i + 1], static_cast<int64_t>(c), 0};
    while (c < chunk_starts.size() && chunk_starts[c] < b.hi) ++c;
    b.count = static_cast<int64_t>(c) - b.first;
    buckets_.push_back(b);
  }
  if (c != chunk_starts.size()) throw std::logic_error("OverlappedStep: optimizer chunks outside the parameters");
  // Below the compute stream's priority: the forward's kernels go first when SMs free up.
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  done_.resize(buckets_.size());
  for (cudaEvent_t& e : done_) MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

OverlappedStep::~OverlappedStep() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
}

void OverlappedStep::launch(cudaStream_t compute, float* grads, const std::function<void(int64_t, int64_t, cudaStream_t)>& update) {
  wait(compute, INT64_MAX);  // the previous step's, if no forward asked for them all
  MT_CUDA_CHECK(cudaEventRecord(ready_, compute));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    if (b.count > 0) update(b.first, b.count, stream_);
    MT_PROF_ON(stream_, "opt.zero_grads", MT_CUDA_CHECK(cudaMemsetAsync(grads + b.lo, 0, static_cast<size_t>(b.hi - b.lo) * 4, stream_)));
    MT_CUDA_CHECK(cudaEventRecord(done_[i], stream_));
  }
  waited_ = 0;
  pending_ = buckets_.size();
  launched_ = true;
}

void OverlappedStep::wait(cudaStream_t compute, int64_t end) {
  while (waited_ < pending_ && buckets_[waited_].lo < end) {
    MT_CUDA_CHECK(cudaStreamWaitEvent(compute, done_[waited_], 0));
    ++waited_;
  }
}

}  // namespace mt
