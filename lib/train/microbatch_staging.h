// microbatch_staging.h (CUDA): one microbatch's inputs on their way to the device: tokens, labels,
// positions, loss mask and the embedding backward's CSRs, written into pinned host memory and copied with
// one cudaMemcpyAsync. A buffer is reused only after an event says its last copy finished, which bounds how
// far the host runs ahead of the device (two iterations with two sets of buffers).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cuda/embedding.h"
#include "model/cuda/gpt_cuda.h"
#include "model/model_dims.h"

namespace mt {

class MicrobatchSlot {
 public:
  // T tokens; max_keys: room for that many hidden-dropout keys (0: no dropout).
  explicit MicrobatchSlot(int64_t T, int64_t max_keys = 0);
  ~MicrobatchSlot();
  MicrobatchSlot(const MicrobatchSlot&) = delete;
  MicrobatchSlot& operator=(const MicrobatchSlot&) = delete;
  // `wait` blocks until an event completes (through an NCCL communicator's watchdog when there is one). The
  // token CSR covers this rank's vocabulary shard [vocab_start, vocab_start + vocab_local).
  // drop_keys (may be empty): the hidden-dropout keys, [B, 1 + 2L] (see DeviceMicrobatch::drop_keys).
  DeviceMicrobatch upload(const Microbatch& mb, bool learned_pos, int64_t vocab_start, int64_t vocab_local, int64_t max_pos, cudaStream_t stream,
                          const std::function<void(cudaEvent_t)>& wait, const std::vector<uint64_t>& drop_keys = {});
  static inline double wait_ms = 0;  // host time spent waiting for staging buffers (all slots)

 private:
  // Three arrays from int32 slot `at`: ids (T), offsets (T + 1), positions (T).
  void put_csr(const cuda::TokenCsr& c, int64_t at);
  int64_t T_;
  size_t n_;
  int64_t max_keys_ = 0;
  int32_t* host_ = nullptr;
  int32_t* dev_ = nullptr;
  cudaEvent_t copied_ = nullptr;
  bool used_ = false;
  int64_t n_pos_ = 0;
};

}  // namespace mt
