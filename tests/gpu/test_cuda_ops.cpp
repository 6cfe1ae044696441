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
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cpu/rope.h"
#include "tensor/dtype.h"
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

template <typename T>
struct DevT {
  T* p;
  size_t n;
  explicit DevT(const std::vector<T>& v) : n(v.size()) {
    p = static_cast<T*>(DeviceAllocator::instance().allocate(std::max<size_t>(1, n) * sizeof(T)));
    MT_CUDA_CHECK(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DevT() { DeviceAllocator::instance().release(p); }
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

void test_embedding(int64_t T, int64_t h, int64_t V) {
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(T));
  for (auto& t : tokens) t = tok(rng);
  Vec wte = randn(static_cast<size_t>(V * h)), g = randn(static_cast<size_t>(T * h));
  // A vocab shard [V/3, V/3 + V/2) as under TP.
  const int64_t vs = V / 3, vl = V / 2;
  Vec out(static_cast<size_t>(T * h)), dw(static_cast<size_t>(vl * h), 0.125f);
  cpu::embedding_forward(out.data(), tokens.data(), nullptr, wte.data() + vs * h, nullptr, T, h, vs, vl);
  cpu::embedding_backward(dw.data(), nullptr, g.data(), tokens.data(), nullptr, T, h, vs, vl);
  DevT<int32_t> dT(tokens);
  Dev dW(Vec(wte.begin() + vs * h, wte.begin() + (vs + vl) * h)), dOut(out.size()), dG(g), dDw(Vec(dw.size(), 0.125f));
  cuda::embedding_forward(dOut.p, dT.p, dW.p, T, h, vs, vl, nullptr);
  const cuda::TokenCsr csr = cuda::build_token_csr(tokens.data(), T, vs, vl);
  DevT<int32_t> ids(csr.ids), offs(csr.offsets), pos(csr.positions);
  cuda::embedding_backward(dDw.p, dG.p, ids.p, offs.p, pos.p, static_cast<int64_t>(csr.ids.size()), h, nullptr);
  const std::string tag = " [T " + std::to_string(T) + ", h " + std::to_string(h) + ", shard]";
  compare("embedding forward" + tag, dOut.get(), out);
  compare("embedding backward (CSR)" + tag, dDw.get(), dw);
}

void test_cross_entropy(int64_t N, int64_t V) {
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (auto& x : t) x = tok(rng);
  Vec logits = randn(static_cast<size_t>(N * V), 3.0f), dloss = randn(static_cast<size_t>(N));
  Vec losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)), d(logits.size());
  cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(), t.data(), N, V);
  cpu::cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), dloss.data(), N, V);
  DevT<int32_t> dT(t);
  Dev dL(logits), dLoss(static_cast<size_t>(N)), dLse(static_cast<size_t>(N)), dDl(dloss);
  cuda::cross_entropy_forward(dLoss.p, dLse.p, dL.p, dT.p, N, V, nullptr);
  cuda::cross_entropy_backward(dL.p, dL.p, dLse.p, dT.p, dDl.p, N, V, nullptr);  // in place
  const std::string tag = " [" + std::to_string(N) + "x" + std::to_string(V) + "]";
  compare("cross-entropy forward" + tag, dLoss.get(), losses);
  compare("cross-entropy backward (in place)" + tag, dL.get(), d);
}

void test_adamw(int64_t n) {
  Vec w = randn(static_cast<size_t>(n)), m = randn(static_cast<size_t>(n), 0.1f), v(static_cast<size_t>(n)), g = randn(static_cast<size_t>(n));
  for (auto& x : v) x = std::fabs(randn(1, 0.1f)[0]);
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % 3 != 0;
  cuda::AdamParams p{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 1.0f - 0.9f * 0.9f, 1.0f - 0.95f * 0.95f};
  Dev dW(w), dM(m), dV(v), dG(g);
  DevT<uint8_t> dMask(mask);
  cuda::adamw_step(dW.p, dM.p, dV.p, dG.p, dMask.p, n, p, nullptr);
  for (int64_t i = 0; i < n; ++i) {  // the update of optim/optimizer.cpp
    const auto k = static_cast<size_t>(i);
    const float gi = g[k] * p.grad_scale;
    m[k] = p.beta1 * m[k] + (1 - p.beta1) * gi;
    v[k] = p.beta2 * v[k] + (1 - p.beta2) * gi * gi;
    const float up = (m[k] / p.bias_correction1) / (std::sqrt(v[k] / p.bias_correction2) + p.eps);
    w[k] -= p.lr * (up + (mask[k] ? p.weight_decay : 0.0f) * w[k]);
  }
  compare("adamw weights [" + std::to_string(n) + "]", dW.get(), w);
  compare("adamw exp_avg", dM.get(), m);
  compare("adamw exp_avg_sq", dV.get(), v);
}

void test_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool bf16) {
  Vec A = randn(static_cast<size_t>(M * K)), B = randn(static_cast<size_t>(K * N)), C = randn(static_cast<size_t>(M * N));
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  std::vector<uint16_t> Ah, Bh;
  if (bf16) {
    for (auto& x : A) {
      Ah.push_back(float_to_bf16(x));
      x = bf16_to_float(Ah.back());
    }
    for (auto& x : B) {
      Bh.push_back(float_to_bf16(x));
      x = bf16_to_float(Bh.back());
    }
  }
  Vec ref = C;
  cpu::gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, ref.data(), N);
  Dev dC(C);
  const std::string tag = std::string(" [") + (ta ? "T" : "N") + (tb ? "T" : "N") + " " + std::to_string(M) + "x" +
                          std::to_string(N) + "x" + std::to_string(K) + (bf16 ? " bf16]" : " fp32]");
  if (bf16) {
    DevT<uint16_t> dA(Ah), dB(Bh);
    cuda::GemmLt::instance().gemm(ta, tb, M, N, K, 0.75f, dA.p, lda, dB.p, ldb, 0.5f, dC.p, N, CUDA_R_16BF, nullptr);
    compare("cuBLASLt gemm" + tag, dC.get(), ref);
  } else {
    Dev dA(A), dB(B);
    cuda::GemmLt::instance().gemm(ta, tb, M, N, K, 0.75f, dA.p, lda, dB.p, ldb, 0.5f, dC.p, N, CUDA_R_32F, nullptr);
    compare("cuBLASLt gemm" + tag, dC.get(), ref);
  }
}

void test_rope(int64_t T, int64_t H, int64_t d, int64_t rot) {
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7) % 2048);
  Vec x = randn(static_cast<size_t>(T * H * d)), ref = x, back = x;
  cpu::rope_forward(ref.data(), pos.data(), T, H, d, rot, 500000.0f);
  cpu::rope_backward(back.data(), pos.data(), T, H, d, rot, 500000.0f);
  const Vec table = cuda::rope_table(2048, rot, 500000.0);
  Dev dTab(table), dX(x), dB(x);
  DevT<int32_t> dP(pos);
  cuda::rope_apply(dX.p, dP.p, dTab.p, T, H, d, rot, 1.0f, nullptr);
  cuda::rope_apply(dB.p, dP.p, dTab.p, T, H, d, rot, -1.0f, nullptr);
  const std::string tag = " [T " + std::to_string(T) + ", d " + std::to_string(d) + ", rot " + std::to_string(rot) + "]";
  compare("rope forward" + tag, dX.get(), ref);
  compare("rope backward" + tag, dB.get(), back);
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
  test_embedding(513, 96, 1000);
  test_rope(301, 8, 128, 128);
  test_rope(33, 3, 64, 32);
  test_cross_entropy(67, 50304);
  test_cross_entropy(5, 7);
  test_adamw(1000003);
  for (bool bf16 : {false, true}) {
    for (int t = 0; t < 4; ++t) test_gemm(t & 1, t & 2, 129, 77, 301, bf16);
    test_gemm(false, true, 1024, 768, 2304, bf16);
  }
  test_allocator();
  std::printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
