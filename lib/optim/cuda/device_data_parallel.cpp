// device_data_parallel.cpp
#include "optim/cuda/device_data_parallel.h"

#include <algorithm>

namespace mt {

DeviceDataParallel::DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, int64_t numel, int64_t bucket_elems,
                                       bool overlap, cudaStream_t compute)
    : comm_(std::move(comm)), grads_(grads), overlap_(overlap), compute_(compute) {
  bucket_elems = std::max<int64_t>(bucket_elems, 1 << 20);
  for (int64_t hi = numel; hi > 0;) {
    const int64_t lo = std::max<int64_t>(0, hi - bucket_elems);
    buckets_.emplace_back(lo, hi);
    hi = lo;
  }
}

void DeviceDataParallel::launch_next() {
  const auto [lo, hi] = buckets_[next_++];
  comm_->all_reduce_after(grads_ + lo, hi - lo, ReduceOp::kAvg, compute_);
}

void DeviceDataParallel::on_grads_ready(int64_t lowest) {
  if (!overlap_) return;
  while (next_ < buckets_.size() && buckets_[next_].first >= lowest) launch_next();
}

void DeviceDataParallel::finish() {
  while (next_ < buckets_.size()) launch_next();
  comm_->join(compute_);
}

}  // namespace mt
