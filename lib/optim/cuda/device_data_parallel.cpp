// device_data_parallel.cpp
#include "optim/cuda/device_data_parallel.h"

#include <algorithm>

#include "kernels/cuda/optimizer_step.h"
#include "tensor/cuda/cuda_check.h"

namespace mt {

DeviceDataParallel::DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, int64_t numel, int64_t bucket_elems,
                                       bool overlap, bool reduce_bf16, cudaStream_t compute)
    : comm_(std::move(comm)), grads_(grads), overlap_(overlap), compute_(compute) {
  if (reduce_bf16) MT_CUDA_CHECK(cudaMalloc(&shadow_, static_cast<size_t>(std::max<int64_t>(numel, 1)) * 2));
  bucket_elems = std::max<int64_t>(bucket_elems, 1 << 20);
  for (int64_t hi = numel; hi > 0;) {
    const int64_t lo = std::max<int64_t>(0, hi - bucket_elems);
    buckets_.emplace_back(lo, hi);
    hi = lo;
  }
}

DeviceDataParallel::~DeviceDataParallel() {
  if (shadow_) cudaFree(shadow_);
}

void DeviceDataParallel::launch_next() {
  const auto [lo, hi] = buckets_[next_++];
  if (!shadow_) {
    comm_->all_reduce_after(grads_ + lo, hi - lo, ReduceOp::kAvg, compute_);
    return;
  }
  auto* s = static_cast<cuda::bf16*>(shadow_) + lo;
  cuda::cast_to_bf16(s, grads_ + lo, hi - lo, compute_);
  comm_->all_reduce_bf16_after(s, hi - lo, ReduceOp::kAvg, compute_);
  cuda::cast_from_bf16(grads_ + lo, s, hi - lo, comm_->stream());
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
