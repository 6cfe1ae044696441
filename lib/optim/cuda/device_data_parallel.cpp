// device_data_parallel.cpp
#include "optim/cuda/device_data_parallel.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/stream_delay.h"
#include "tensor/cuda/op_profiler.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt {

DeviceDataParallel::DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, int64_t lo, int64_t hi, int64_t bucket_elems,
                                       bool overlap, bool reduce_bf16, bool prescaled, cudaStream_t compute)
    : comm_(std::move(comm)), grads_(grads), overlap_(overlap), op_(prescaled ? ReduceOp::kSum : ReduceOp::kAvg), compute_(compute) {
  if (reduce_bf16) alloc_shadow(lo, hi);
  bucket_elems = std::max<int64_t>(bucket_elems, 1 << 20);
  for (int64_t top = hi; top > lo;) {
    const int64_t bottom = std::max<int64_t>(lo, top - bucket_elems);
    buckets_.push_back({bottom, top, {}, bottom, top});
    top = bottom;
  }
}

DeviceDataParallel::DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, std::vector<DeviceBucket> sharded, bool overlap,
                                       bool reduce_bf16, bool prescaled, cudaStream_t compute)
    : comm_(std::move(comm)),
      grads_(grads),
      overlap_(overlap),
      sharded_(true),
      op_(prescaled ? ReduceOp::kSum : ReduceOp::kAvg),
      compute_(compute),
      buckets_(std::move(sharded)) {
  if (buckets_.empty()) throw std::logic_error("DeviceDataParallel: no buckets");
  if (reduce_bf16) {
    int64_t lo = buckets_.front().lo, hi = buckets_.front().hi;
    for (const DeviceBucket& b : buckets_) {
      lo = std::min(lo, b.lo);
      hi = std::max(hi, b.hi);
    }
    alloc_shadow(lo, hi);
  }
  // Tests: make every bucket's gather late, so a forward that does not wait for the buckets it reads sees
  // last step's weights.
  if (const char* delay = std::getenv("MEGATRAIN_TEST_GATHER_DELAY_US")) test_delay_us_ = std::atoll(delay);
}

void DeviceDataParallel::alloc_shadow(int64_t lo, int64_t hi) {
  base_ = lo;
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(hi - lo, 1)) * 2;
  shadow_ = comm_->alloc_window(bytes);
  shadow_window_ = shadow_ != nullptr;
  if (!shadow_window_) shadow_ = device_malloc(bytes, "the distributed optimizer's parameter gather buffer");
}

DeviceDataParallel::~DeviceDataParallel() {
  if (shadow_ && !shadow_window_) device_free(shadow_);  // a window goes with the communicator
  for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
}

void DeviceDataParallel::launch_next() {
  const DeviceBucket& b = buckets_[next_++];
  const int64_t n = b.hi - b.lo;
  if (!shadow_) {
    if (sharded_) comm_->reduce_scatter_v_after(grads_ + b.lo, b.shard_counts, WireType::kF32, op_, compute_);
    else comm_->all_reduce_after(grads_ + b.lo, n, op_, compute_);
    return;
  }
  // The rounding to bf16 runs on the communicator's stream too, after the compute stream's work so far: on
  // the compute stream it was a gap of 0.15-0.3 ms per layer in the backward (one pass over the bucket).
  auto* s = static_cast<cuda::bf16*>(shadow_);  // (flat offset o at s[o - base_])
  cudaStream_t cs = comm_->stream();
  comm_->follow(compute_);
  MT_PROF_ON(cs, "dp.grad_to_bf16", cuda::cast_to_bf16(s + (b.lo - base_), grads_ + b.lo, n, cs));
  if (sharded_) comm_->reduce_scatter_v_after(s + (b.lo - base_), b.shard_counts, WireType::kBF16, op_, cs);
  else comm_->all_reduce_bf16_after(s + (b.lo - base_), n, op_, cs);
  // Widen what this rank uses: its block (distributed optimizer) or the whole bucket.
  cuda::cast_from_bf16(grads_ + b.shard_lo, s + (b.shard_lo - base_), b.shard_hi - b.shard_lo, comm_->stream());
}

void DeviceDataParallel::on_grads_ready(int64_t lowest) {
  if (!overlap_) return;
  while (next_ < buckets_.size() && buckets_[next_].lo >= lowest) launch_next();
}

void DeviceDataParallel::finish() {
  while (next_ < buckets_.size()) launch_next();
  comm_->join(compute_);
}

void DeviceDataParallel::gather_params(cuda::bf16* w16) {
  if (!sharded_) return;
  for (const DeviceBucket& b : buckets_) comm_->all_gather_v_on(w16 + b.lo, b.shard_counts, WireType::kBF16, compute_);
}

void DeviceDataParallel::start_param_gather(cuda::bf16* w16, const std::function<void(int64_t lo)>& update) {
  if (!sharded_) throw std::logic_error("overlapped parameter gather without the distributed optimizer");
  wait_params(INT64_MAX);  // the previous iteration's, if a forward never asked for them all
  if (gathered_.empty()) {
    gathered_.resize(buckets_.size());
    for (cudaEvent_t& e : gathered_) MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  const size_t n = buckets_.size();
  for (size_t i = 0; i < n; ++i) {
    const DeviceBucket& b = buckets_[n - 1 - i];
    update(b.lo);
    comm_->follow(compute_);
    cuda::stream_delay(test_delay_us_, comm_->stream());
    MT_PROF_ON(comm_->stream(), "dp.param_gather", comm_->all_gather_v_on(w16 + b.lo, b.shard_counts, WireType::kBF16, comm_->stream()));
    MT_CUDA_CHECK(cudaEventRecord(gathered_[i], comm_->stream()));
  }
  waited_ = 0;
  pending_ = n;
}

void DeviceDataParallel::wait_params(int64_t end) {
  const size_t n = buckets_.size();
  while (waited_ < pending_ && buckets_[n - 1 - waited_].lo < end) {
    MT_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_[waited_], 0));
    ++waited_;
  }
}

}  // namespace mt
