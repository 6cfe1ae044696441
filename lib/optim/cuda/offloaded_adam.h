// offloaded_adam.h: the part of the CUDA engine's optimizer state kept on the CPU (--optimizer-cpu-offload,
// --optimizer-offload-fraction): its fp32 master weights and Adam moments live in host memory and CPU threads
// update them. Each step streams the gradients down and the new 16-bit weights up in pieces through pinned
// staging buffers, three ways at once: piece k+1's gradients come down and piece k-1's weights go up while the
// CPU updates piece k (a copy stream each way; the GPU's own part of the update runs meanwhile). The host waits
// for the step's state (skip decision, clip factor, bias corrections) and the pieces; the training stream waits
// for the last weights before the next forward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/optimizer_step.h"
#include "optim/host_adam.h"

namespace mt {

class OffloadedAdam {
 public:
  // The offloaded chunks (their state index in [0, n), gradient and weight index at start), sorted by state; the
  // state arrays (n floats each) stay owned by the caller.
  OffloadedAdam(std::vector<cuda::AdamChunk> chunks, float* master, float* exp_avg, float* exp_avg_sq, int threads);
  ~OffloadedAdam();
  OffloadedAdam(const OffloadedAdam&) = delete;
  OffloadedAdam& operator=(const OffloadedAdam&) = delete;
  // One update in two calls. start(), once `stream` has the gradients d_grads and the step state final: the state
  // and the first pieces' gradients start down (the device's own update may be queued after it and overlap).
  // finish(): reads the state, updates the offloaded weights (nothing when the step is skipped) and sends their
  // 16-bit copies into d_w16; `stream` waits for them (and, skipped, for the gradients' copies).
  void start(const float* d_grads, const cuda::StepState* d_state, cudaStream_t stream);
  // `wait` waits for the step's state (after the step's collectives: the engine's wait, bounded by
  // --distributed-timeout-seconds, so a stopped peer ends the job instead of hanging it).
  void finish(void* d_w16, cudaStream_t stream, const HostAdamStep& params, const std::function<void(cudaEvent_t)>& wait);
  // Sum over the chunks of norm_weight * w^2 (the parameters norm's offloaded part).
  double master_sumsq();
  int threads() const { return pool_.threads(); }

 private:
  struct Piece {  // chunks [first, last) of chunks_, contiguous in both the gradients and the state
    int64_t first = 0, last = 0, start = 0, state = 0, len = 0;
  };
  std::vector<cuda::AdamChunk> chunks_;
  std::vector<Piece> pieces_;
  float *w_, *m_, *v_;
  WorkerPool pool_;
  static constexpr int kSlots = 3;
  float* grads_host_[kSlots] = {};
  uint16_t* weights_host_[kSlots] = {};
  cuda::StepState* state_host_ = nullptr;
  cudaStream_t down_ = nullptr, up_ = nullptr;
  cudaEvent_t ready_ = nullptr, state_ev_ = nullptr, down_ev_[kSlots] = {}, up_ev_[kSlots] = {}, done_ = nullptr;
  bool up_used_[kSlots] = {};
  const float* d_grads_ = nullptr;  // this step's (start() to finish())
  void fetch(int64_t piece);
};

// The worker threads for the offloaded update: MEGATRAIN_OFFLOAD_THREADS; else the cores this process is bound to
// where the launcher bound it; else the machine's cores shared among its ranks (the launcher's local count, else the
// GPUs this rank sees).
int offload_threads();

}  // namespace mt
