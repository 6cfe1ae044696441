// test_cuda_ops.cpp: every CUDA op against the CPU reference on random inputs of odd sizes (outputs
// poisoned with NaN first, so an unwritten element fails), and the caching allocator's steady state.
// Exit 77 (skipped, with a message) where no GPU is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/norm.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

using namespace mt;
using Vec = std::vector<float>;

namespace {

int failures = 0;
std::mt19937 rng(1234);

Vec randn(size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Dev {
  float* p;
  size_t n;
  explicit Dev(size_t count, bool poison = true) : n(count) {
    p = static_cast<float*>(DeviceAllocator::instance().allocate(std::max<size_t>(1, n) * sizeof(float)));
    if (poison) MT_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(float)));  // all-ones bits: NaN
  }
  Dev(const Vec& v) : Dev(v.size(), false) { MT_CUDA_CHECK(cudaMemcpy(p, v.data(), n * sizeof(float), cudaMemcpyHostToDevice)); }
  ~Dev() { DeviceAllocator::instance().release(p); }
  Vec get() const {
    Vec v(n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
};

void compare(const std::string& what, const Vec& got, const Vec& ref, double tol = 1e-5) {
  double num = 0, den = 0;
  bool nan = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    nan |= !std::isfinite(got[i]);
    num += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  const bool ok = !nan && rel <= tol;
  if (!ok) ++failures;
  std::printf("%-4s %-34s rel err %.2e%s\n", ok ? "ok" : "FAIL", what.c_str(), rel, nan ? " (NaN / unwritten)" : "");
}

void test_norms(int64_t N, int64_t h) {
  const std::string tag = " [" + std::to_string(N) + "x" + std::to_string(h) + "]";
  Vec x = randn(static_cast<size_t>(N * h)), w = randn(static_cast<size_t>(h)), b = randn(static_cast<size_t>(h)), g = randn(x.size());
  Vec out(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)), dx(x.size()), dw(w.size(), 0.5f), db(b.size(), 0.25f);
  cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, h, 1e-5f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(), rstd.data(), N, h);
  Dev dX(x), dW(w), dB(b), dG(g), dOut(x.size()), dMean(static_cast<size_t>(N)), dRstd(static_cast<size_t>(N)), dDx(x.size());
  Dev dDw(Vec(w.size(), 0.5f)), dDb(Vec(b.size(), 0.25f));
  cuda::layernorm_forward(dOut.p, dMean.p, dRstd.p, dX.p, dW.p, dB.p, N, h, 1e-5f, nullptr);
  cuda::layernorm_backward(dDx.p, dDw.p, dDb.p, dG.p, dX.p, dW.p, dMean.p, dRstd.p, N, h, nullptr);
  compare("layernorm forward" + tag, dOut.get(), out);
  compare("layernorm backward dx" + tag, dDx.get(), dx);
  compare("layernorm backward dw (accumulated)" + tag, dDw.get(), dw);
  compare("layernorm backward db (accumulated)" + tag, dDb.get(), db);
  Vec rout(x.size()), rr(static_cast<size_t>(N)), rdx(x.size()), rdw(w.size(), 0.5f);
  cpu::rmsnorm_forward(rout.data(), rr.data(), x.data(), w.data(), N, h, 1e-6f);
  cpu::rmsnorm_backward(rdx.data(), rdw.data(), g.data(), x.data(), w.data(), rr.data(), N, h);
  Dev cOut(x.size()), cR(static_cast<size_t>(N)), cDx(x.size()), cDw(Vec(w.size(), 0.5f));
  cuda::rmsnorm_forward(cOut.p, cR.p, dX.p, dW.p, N, h, 1e-6f, nullptr);
  cuda::rmsnorm_backward(cDx.p, cDw.p, dG.p, dX.p, dW.p, cR.p, N, h, nullptr);
  compare("rmsnorm forward" + tag, cOut.get(), rout);
  compare("rmsnorm backward dx" + tag, cDx.get(), rdx);
  compare("rmsnorm backward dw (accumulated)" + tag, cDw.get(), rdw);
}

void test_activations(int64_t N, int64_t F) {
  const std::string tag = " [" + std::to_string(N) + "x" + std::to_string(F) + "]";
  Vec x = randn(static_cast<size_t>(N * F), 2.0f), g = randn(x.size()), y(x.size()), dx(x.size());
  cpu::gelu_forward(y.data(), x.data(), N * F);
  cpu::gelu_backward(dx.data(), g.data(), x.data(), N * F);
  Dev dX(x), dG(g), dY(x.size()), dDx(x.size());
  cuda::gelu_forward(dY.p, dX.p, N * F, nullptr);
  cuda::gelu_backward(dDx.p, dG.p, dX.p, N * F, nullptr);
  compare("gelu forward" + tag, dY.get(), y);
  compare("gelu backward" + tag, dDx.get(), dx);
  Vec xs = randn(static_cast<size_t>(N * 2 * F), 2.0f), ys(static_cast<size_t>(N * F)), dxs(xs.size());
  cpu::swiglu_forward(ys.data(), xs.data(), N, F);
  cpu::swiglu_backward(dxs.data(), g.data(), xs.data(), N, F);
  Dev sX(xs), sY(ys.size()), sDx(xs.size());
  cuda::swiglu_forward(sY.p, sX.p, N, F, nullptr);
  cuda::swiglu_backward(sDx.p, dG.p, sX.p, N, F, nullptr);
  compare("swiglu forward" + tag, sY.get(), ys);
  compare("swiglu backward" + tag, sDx.get(), dxs);
}

void test_allocator() {
  auto& a = DeviceAllocator::instance();
  for (int step = 0; step < 3; ++step) {
    std::vector<void*> blocks;
    for (size_t sz : {100ul, 5000ul, 1ul << 20, 3ul << 20, 100ul << 20}) blocks.push_back(a.allocate(sz));
    for (void* b : blocks) a.release(b);
    if (step == 0) continue;
  }
  const auto before = a.stats();
  for (int step = 0; step < 10; ++step) {
    std::vector<void*> blocks;
    for (size_t sz : {100ul, 5000ul, 1ul << 20, 3ul << 20, 100ul << 20}) blocks.push_back(a.allocate(sz));
    for (void* b : blocks) a.release(b);
  }
  const auto after = a.stats();
  const bool ok = after.device_mallocs == before.device_mallocs && after.requests == before.requests + 50;
  if (!ok) ++failures;
  std::printf("%-4s %-34s %lld cudaMalloc calls in 10 steady-state steps\n", ok ? "ok" : "FAIL", "caching allocator",
              static_cast<long long>(after.device_mallocs - before.device_mallocs));
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no GPU visible: CUDA op tests run on the GPU machine (scripts/test_gpu.sh)\n");
    return 77;
  }
  test_norms(3, 7);
  test_norms(37, 1000);
  test_norms(129, 4096);
  test_activations(5, 3);
  test_activations(301, 1111);
  test_allocator();
  std::printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
