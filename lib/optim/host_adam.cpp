// host_adam.cpp: the offloaded AdamW update and its worker threads.
#include "optim/host_adam.h"

#include <cmath>

#include "tensor/dtype.h"

namespace mt {

void host_adamw(float* w, float* m, float* v, const float* g, uint16_t* w16, int64_t n, bool decay, const HostAdamStep& s) {
  const float b1 = s.beta1, b2 = s.beta2, bc1 = s.bc1, bc2 = s.bc2, lr = s.lr, eps = s.eps, scale = s.scale;
  const float wd = decay ? s.weight_decay : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * scale;
    float mi = m[i], vi = v[i], wi = w[i];
    mi = b1 * mi + (1.0f - b1) * gi;
    vi = b2 * vi + (1.0f - b2) * gi * gi;
    const float update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    wi = wi - lr * (update + wd * wi);
    m[i] = s.exp_avg_bf16 ? round_bf16(mi) : mi;
    v[i] = s.exp_avg_sq_bf16 ? round_bf16(vi) : vi;
    w[i] = wi;
    w16[i] = s.fp16 ? float_to_fp16(wi) : float_to_bf16(wi);
  }
}

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void WorkerPool::drain() {
  for (;;) {
    int64_t i;
    const std::function<void(int64_t)>* f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (job_ == nullptr || next_ >= total_) return;
      i = next_++;
      f = job_;
    }
    (*f)(i);
    std::lock_guard<std::mutex> lock(mu_);
    if (++finished_ == total_) done_.notify_all();
  }
}

void WorkerPool::work() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain();
  }
}

void WorkerPool::run(int64_t n, const std::function<void(int64_t)>& f) {
  if (n <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &f;
    next_ = 0;
    total_ = n;
    finished_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return finished_ == total_; });
  job_ = nullptr;
}

}  // namespace mt
