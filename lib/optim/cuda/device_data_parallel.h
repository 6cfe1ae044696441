// device_data_parallel.h: data parallelism for the CUDA engine: the fp32 gradient buffer is cut into
// buckets from the top of the flat layout, the order in which the backward finishes them; each bucket is
// averaged over the data-parallel group with NCCL on the communicator's own stream (see prescaled below),
// started as soon as its
// gradients are final (--overlap-grad-reduce) or after the backward. With the distributed optimizer the
// buckets are the CPU engine's (whole parameters, each split over the DP ranks): each rank's block is
// averaged onto its owner only, and after the optimizer step the updated bf16 weights are gathered back.
// Everything is stream-ordered: the host never waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/cuda/nccl_communicator.h"
#include "kernels/cuda/bf16_fwd.h"

namespace mt {

struct DeviceBucket {
  int64_t lo = 0, hi = 0;             // flat range [lo, hi)
  std::vector<int64_t> shard_counts;  // distributed optimizer: elements owned by each DP rank, back to back from lo
  int64_t shard_lo = 0, shard_hi = 0;  // this rank's block
};

class DeviceDataParallel {
 public:
  // All-reduce buckets of bucket_elems elements over the flat range [lo, hi) of the gradients. reduce_bf16 (--grad-reduce-in-bf16): each bucket is rounded
  // to bf16, reduced in bf16 (half the bytes on the wire) and widened back into the fp32 buffer.
  // prescaled: the reductions sum, and the caller's backward scales each rank's gradients by grad_share()
  // = 1 / DP (NCCL's symmetric-memory kernels only sum; exact in bf16 / fp32 for DP a power of two); else
  // they average (fp16, whose gradients would lose log2(DP) bits to underflow with the scaling in the backward).
  DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, int64_t lo, int64_t hi, int64_t bucket_elems, bool overlap,
                     bool reduce_bf16, bool prescaled, cudaStream_t compute);
  // Distributed optimizer: the given sharded buckets (highest first; not empty); afterwards each rank's blocks hold the
  // DP average, the rest of the buffer is stale.
  DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, std::vector<DeviceBucket> sharded, bool overlap, bool reduce_bf16,
                     bool prescaled, cudaStream_t compute);
  ~DeviceDataParallel();
  void start_iteration() { next_ = 0; }
  // The backward's hook: gradients at offsets >= lowest are final.
  void on_grads_ready(int64_t lowest);
  // Launches what is left; the compute stream then waits for every bucket.
  void finish();
  // Distributed optimizer, after the step wrote each rank's blocks of w16: every block to every rank (queued
  // on the compute stream).
  void gather_params(cuda::bf16* w16);
  // --overlap-param-gather: the same gather bucket by bucket, lowest first: update(lo) queues the step of
  // the bucket starting at flat offset lo on the compute stream, then its gather goes on the communicator's
  // stream behind it (overlapping the next buckets' updates and the next forward), its completion recorded;
  // the forward calls wait_params before it reads parameters.
  void start_param_gather(cuda::bf16* w16, const std::function<void(int64_t lo)>& update);
  const std::vector<DeviceBucket>& bucket_list() const { return buckets_; }
  // The compute stream waits for the pending gathers of every bucket holding flat offsets below `end`
  // (INT64_MAX: all of them; a no-op when nothing is pending).
  void wait_params(int64_t end);
  size_t buckets() const { return buckets_.size(); }
  // What the backward scales each rank's gradients by: 1 / DP when prescaled (the sum is then the average), else 1.
  float grad_share() const { return op_ == ReduceOp::kSum ? 1.0f / static_cast<float>(comm_->size()) : 1.0f; }
  NcclCommunicator& comm() { return *comm_; }

 private:
  void launch_next();
  void alloc_shadow(int64_t lo, int64_t hi);  // the shadow of [lo, hi)
  std::shared_ptr<NcclCommunicator> comm_;
  float* grads_;
  bool overlap_, sharded_ = false;
  ReduceOp op_;
  void* shadow_ = nullptr;  // bf16 copy of the gradients (reduce_bf16) from flat offset base_, in the group's window where it has one
  int64_t base_ = 0;
  bool shadow_window_ = false;
  cudaStream_t compute_;
  std::vector<DeviceBucket> buckets_;  // highest first
  size_t next_ = 0;
  std::vector<cudaEvent_t> gathered_;  // per bucket, lowest first (overlapped parameter gather)
  size_t waited_ = 0, pending_ = 0;    // buckets (lowest first) the compute stream waits for / has gathers queued
  int64_t test_delay_us_ = 0;          // MEGATRAIN_TEST_GATHER_DELAY_US: each bucket's gather made this late (tests)
};

}  // namespace mt
