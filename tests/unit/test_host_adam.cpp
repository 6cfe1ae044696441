// test_host_adam.cpp: the offloaded optimizer's CPU update (--optimizer-cpu-offload) against AdamW computed in double
// over several steps, its 16-bit copies, and the worker threads (the GPU tests compare it with the GPU's update).
#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include "catch.h"
#include "optim/host_adam.h"
#include "tensor/dtype.h"

using namespace mt;

TEST_CASE("host AdamW: the textbook update in double, five steps, with clipping and decay, and its bf16 / fp16 copies") {
  const int64_t n = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> w(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<double> wd(n), md(n, 0.0), vd(n, 0.0);
  for (int64_t i = 0; i < n; ++i) wd[static_cast<size_t>(i)] = w[static_cast<size_t>(i)] = dist(rng);
  std::vector<uint16_t> w16(n);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, lr = 1e-2, decay = 0.1;
  for (int t = 1; t <= 5; ++t) {
    std::vector<float> g(n);
    for (auto& x : g) x = 4.0f * dist(rng);
    HostAdamStep s;
    s.lr = static_cast<float>(lr);
    s.beta1 = static_cast<float>(b1);
    s.beta2 = static_cast<float>(b2);
    s.eps = static_cast<float>(eps);
    s.weight_decay = static_cast<float>(decay);
    s.scale = 0.5f;  // a clip factor
    s.bc1 = static_cast<float>(1.0 - std::pow(b1, t));
    s.bc2 = static_cast<float>(1.0 - std::pow(b2, t));
    s.fp16 = t % 2 == 0;
    const bool with_decay = t != 3;
    host_adamw(w.data(), m.data(), v.data(), g.data(), w16.data(), n, with_decay, s);
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(i);
      const double gi = 0.5 * g[k];
      md[k] = b1 * md[k] + (1 - b1) * gi;
      vd[k] = b2 * vd[k] + (1 - b2) * gi * gi;
      const double mh = md[k] / (1 - std::pow(b1, t)), vh = vd[k] / (1 - std::pow(b2, t));
      wd[k] -= lr * (mh / (std::sqrt(vh) + eps) + (with_decay ? decay : 0.0) * wd[k]);
      // The 16-bit copy is the fp32 master's, rounded to nearest even.
      REQUIRE(w16[k] == (s.fp16 ? float_to_fp16(w[k]) : float_to_bf16(w[k])));
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(w[static_cast<size_t>(i)] - wd[static_cast<size_t>(i)]));
  CHECK(worst < 1e-5);  // fp32 arithmetic against double over five steps of 1e-2
}

TEST_CASE("worker pool: every item once, over repeated jobs of any size") {
  WorkerPool pool(4);
  CHECK(pool.threads() == 4);
  for (int64_t n : {1, 3, 4, 17, 1000, 0, 5}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(n, 1)));
    for (int round = 0; round < 20; ++round) pool.run(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)].load() == 20);
  }
  WorkerPool alone(1);  // the caller alone
  int64_t sum = 0;
  alone.run(100, [&](int64_t i) { sum += i; });
  CHECK(sum == 4950);
}
