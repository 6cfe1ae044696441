// host_adam.h: AdamW on host arrays, element for element the CUDA engine's update (kernels/cuda/optimizer_step.cu:
// the same float operations in the same order), for the optimizer state offloaded to the CPU; and the worker
// threads that run it over a range in parallel.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mt {

struct HostAdamStep {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  float decoupled_lr = -1;  // --decoupled-lr: the rate of the chunks marked decoupled, when >= 0 (the caller picks)
  float scale = 1;     // applied to the gradients: the clip factor times the loss scale's inverse
  float bc1 = 1, bc2 = 1;  // 1 - beta^t
  bool fp16 = false;   // the working copy's type: fp16, else bf16
  // --exp-avg-dtype / --exp-avg-sq-dtype bf16: the moment stored rounded to bf16 (the update computed from it unrounded)
  bool exp_avg_bf16 = false, exp_avg_sq_bf16 = false;
};

// n elements: w (fp32 master), m, v updated in place from g; w16 receives the 16-bit working copy (bf16 or fp16
// bits, round to nearest even). `decay`: the parameter takes weight decay.
void host_adamw(float* w, float* m, float* v, const float* g, uint16_t* w16, int64_t n, bool decay, const HostAdamStep& s);

// A fixed set of worker threads: run(n, f) calls f(i) for i in [0, n), spread over the workers and the caller,
// and returns when every call has.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  void run(int64_t n, const std::function<void(int64_t)>& f);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void work();
  void drain();  // takes items until none are left (caller and workers alike)
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t next_ = 0, total_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace mt
