// device_data_parallel.h: data parallelism for the CUDA engine: the fp32 gradient buffer is cut into
// buckets (--ddp-bucket-size elements) from the top of the flat layout, the order in which the backward
// finishes them; each bucket is averaged over the data-parallel group with NCCL on the communicator's own
// stream, started as soon as its gradients are final (--overlap-grad-reduce) or after the backward.
// Everything is stream-ordered: the host never waits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/cuda/nccl_communicator.h"

namespace mt {

class DeviceDataParallel {
 public:
  // reduce_bf16 (--grad-reduce-in-bf16): each bucket is rounded to bf16, averaged in bf16 (half the
  // bytes on the wire) and widened back into the fp32 buffer.
  DeviceDataParallel(std::shared_ptr<NcclCommunicator> comm, float* grads, int64_t numel, int64_t bucket_elems, bool overlap,
                     bool reduce_bf16, cudaStream_t compute);
  ~DeviceDataParallel();
  void start_iteration() { next_ = 0; }
  // The backward's hook: gradients at offsets >= lowest are final.
  void on_grads_ready(int64_t lowest);
  // Launches what is left; the compute stream then waits for every bucket.
  void finish();
  size_t buckets() const { return buckets_.size(); }
  NcclCommunicator& comm() { return *comm_; }

 private:
  void launch_next();
  std::shared_ptr<NcclCommunicator> comm_;
  float* grads_;
  bool overlap_;
  void* shadow_ = nullptr;  // bf16 copy of the gradients (reduce_bf16)
  cudaStream_t compute_;
  std::vector<std::pair<int64_t, int64_t>> buckets_;  // [lo, hi), highest first
  size_t next_ = 0;
};

}  // namespace mt
