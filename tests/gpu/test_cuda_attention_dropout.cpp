// test_cuda_attention_dropout.cpp: attention dropout in cuDNN's fused attention (kernels/cuda/sdpa_cudnn.h,
// SdpaShape::dropout). cuDNN draws the keep mask with its own Philox generator, so the test first reads the mask back:
// with V one-hot (key j's value is the unit vector e_j), the output row of query i is the row of kept, scaled
// probabilities itself, and dividing it by the same call without dropout leaves 1 / (1 - p) where a probability was
// kept and 0 where it was dropped. Then, with random Q, K, V and dO and the same seed, the output and dQ, dK, dV are
// checked against an fp64 reference that applies that mask (causal, grouped-query heads, documents), in bf16's
// tolerance: the forward's and the backward's masks are the same, the scale is 1 / (1 - p), and the backward is the
// dropout's. Also: the kept fraction is 1 - p within the sampling noise, a seed gives the same mask every call, and
// another seed another mask. Exit 77 (skipped) where no GPU is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_check.h"
#include "kernels/cuda/document_bias.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/device_info.h"

namespace {

using mt::test::check;
using mt::test::download;
using mt::test::failures;
using mt::test::from_16;
using mt::test::random_bf16_values;
using mt::test::rel_err;
using mt::test::to_16;
using mt::test::upload;

struct Case {
  int64_t B, S, Hq, Hk, D;
  float p;
  bool documents = false, fp16 = false;
  std::string name() const {
    return "B" + std::to_string(B) + " S" + std::to_string(S) + " H" + std::to_string(Hq) + "/" + std::to_string(Hk) + " D" + std::to_string(D) +
           " p " + std::to_string(p).substr(0, 4) + (documents ? " with documents" : "") + (fp16 ? " (fp16)" : "");
  }
};

// Each sample cut into documents whose lengths grow from a sample-dependent start (query i sees keys [start, i]).
std::vector<int32_t> document_starts(const Case& c) {
  std::vector<int32_t> out;
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t start = 0, len = 3 + 5 * b;
    for (int64_t i = 0; i < c.S; ++i) {
      if (i - start >= len) start = i, len = len % 29 + 4;
      out.push_back(static_cast<int32_t>(start));
    }
  }
  return out;
}

// The device side of one case: inputs, outputs and (with documents) the bias, in the case's 16-bit type.
class Run {
 public:
  explicit Run(const Case& c) : c_(c), nq_(static_cast<size_t>(c.B * c.S * c.Hq * c.D)), nk_(static_cast<size_t>(c.B * c.S * c.Hk * c.D)) {
    q_ = alloc16(nq_), k_ = alloc16(nk_), v_ = alloc16(nk_), o_ = alloc16(nq_), do_ = alloc16(nq_);
    dq_ = alloc16(nq_), dk_ = alloc16(nk_), dv_ = alloc16(nk_);
    cudaMalloc(&stats_, static_cast<size_t>(c.B * c.Hq * c.S) * sizeof(float));
    if (c.documents) {
      starts_ = upload(document_starts(c));
      bias_ = alloc16(static_cast<size_t>(c.B * c.S * c.S));
      mt::cuda::document_bias(static_cast<mt::cuda::bf16*>(bias_), starts_, c.B, c.S, nullptr, type());
    }
  }
  ~Run() {
    for (void* p : {q_, k_, v_, o_, do_, dq_, dk_, dv_, static_cast<void*>(stats_), static_cast<void*>(starts_), bias_}) cudaFree(p);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void set(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& dout) {
    put(q_, q), put(k_, k), put(v_, v), put(do_, dout);
  }
  // The output (with dropout seeded by `seed`, or none for 0).
  std::vector<float> forward(uint64_t seed) {
    mt::cuda::CudnnSdpa::instance().forward(shape(seed), q_, k_, v_, o_, stats_, nullptr, bias_, seed);
    return get(o_, nq_);
  }
  // dQ, dK, dV after forward(seed).
  std::vector<std::vector<float>> backward(uint64_t seed) {
    mt::cuda::CudnnSdpa::instance().backward(shape(seed), q_, k_, v_, o_, do_, stats_, dq_, dk_, dv_, nullptr, bias_, seed);
    return {get(dq_, nq_), get(dk_, nk_), get(dv_, nk_)};
  }

 private:
  mt::cuda::F16 type() const { return c_.fp16 ? mt::cuda::F16::kFP16 : mt::cuda::F16::kBF16; }
  mt::cuda::SdpaShape shape(uint64_t seed) const {
    mt::cuda::SdpaShape s{c_.B, c_.S, c_.Hq, c_.Hk, c_.D, 1.0f / std::sqrt(static_cast<float>(c_.D)), type(), c_.documents};
    if (seed != 0) s.dropout = c_.p;
    return s;
  }
  static void* alloc16(size_t n) {
    void* p = nullptr;
    cudaMalloc(&p, n * 2);
    cudaMemset(p, 0, n * 2);
    return p;
  }
  void put(void* dst, const std::vector<float>& x) { cudaMemcpy(dst, to_16(x, c_.fp16).data(), x.size() * 2, cudaMemcpyHostToDevice); }
  std::vector<float> get(const void* src, size_t n) {
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("a CUDA error after the attention");
    return from_16(download(static_cast<const uint16_t*>(src), n), c_.fp16);
  }
  Case c_;
  size_t nq_, nk_;
  void *q_, *k_, *v_, *o_, *do_, *dq_, *dk_, *dv_, *bias_ = nullptr;
  float* stats_ = nullptr;
  int32_t* starts_ = nullptr;
};

// Whether query i may see key j in sample b.
bool visible(const Case& c, const std::vector<int32_t>& starts, int64_t b, int64_t i, int64_t j) {
  return j <= i && (!c.documents || j >= starts[static_cast<size_t>(b * c.S + i)]);
}

// The keep mask [B, Hq, S, S] read back through one-hot values (see the file comment); -1 where the ratio is neither
// 0 nor 1 / (1 - p) (within 3%), 0 where not visible.
std::vector<int> read_mask(Run& run, const Case& c, uint64_t seed) {
  const size_t nq = static_cast<size_t>(c.B * c.S * c.Hq * c.D), nk = static_cast<size_t>(c.B * c.S * c.Hk * c.D);
  std::vector<float> v(nk, 0.0f);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t j = 0; j < c.S; ++j) {
      for (int64_t g = 0; g < c.Hk; ++g) v[static_cast<size_t>(((b * c.S + j) * c.Hk + g) * c.D + j)] = 1.0f;
    }
  }
  run.set(random_bf16_values(nq, 11), random_bf16_values(nk, 12), v, std::vector<float>(nq, 0.0f));
  const std::vector<float> plain = run.forward(0), dropped = run.forward(seed);
  const std::vector<int32_t> starts = c.documents ? document_starts(c) : std::vector<int32_t>();
  const double r = 1.0 / (1.0 - c.p);
  std::vector<int> mask(static_cast<size_t>(c.B * c.Hq * c.S * c.S), 0);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t i = 0; i < c.S; ++i) {
        for (int64_t j = 0; j < c.S; ++j) {
          if (!visible(c, starts, b, i, j)) continue;
          const size_t at = static_cast<size_t>(((b * c.S + i) * c.Hq + h) * c.D + j);
          const double ratio = dropped[at] / static_cast<double>(plain[at]);
          int& m = mask[static_cast<size_t>(((b * c.Hq + h) * c.S + i) * c.S + j)];
          m = std::fabs(ratio) < 0.03 * r ? 0 : std::fabs(ratio - r) < 0.03 * r ? 1 : -1;
        }
      }
    }
  }
  return mask;
}

struct Reference {
  std::vector<double> o, dq, dk, dv;
};

// fp64 attention with the keep mask applied to the probabilities (scaled by 1 / (1 - p)), forward and backward.
Reference reference(const Case& c, const std::vector<int>& mask, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& dout) {
  const std::vector<int32_t> starts = c.documents ? document_starts(c) : std::vector<int32_t>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D)), r = 1.0 / (1.0 - c.p);
  const int64_t group = c.Hq / c.Hk;
  Reference out{std::vector<double>(q.size()), std::vector<double>(q.size()), std::vector<double>(k.size()), std::vector<double>(k.size())};
  std::vector<double> prob(static_cast<size_t>(c.S)), dp(static_cast<size_t>(c.S));
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return static_cast<size_t>(((b * c.S + i) * c.Hq + h) * c.D); };
  auto ki = [&](int64_t b, int64_t j, int64_t g) { return static_cast<size_t>(((b * c.S + j) * c.Hk + g) * c.D); };
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < c.S; ++i) {
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(c, starts, b, i, j)) continue;
          double s = 0;
          for (int64_t d = 0; d < c.D; ++d) s += q[qi(b, i, h) + d] * static_cast<double>(k[ki(b, j, g) + d]);
          prob[j] = s * scale;
          mx = std::max(mx, prob[j]);
        }
        for (int64_t j = 0; j <= i; ++j) z += visible(c, starts, b, i, j) ? std::exp(prob[j] - mx) : 0.0;
        double sum_pdp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(c, starts, b, i, j)) {
            prob[j] = 0, dp[j] = 0;
            continue;
          }
          prob[j] = std::exp(prob[j] - mx) / z;
          const double keep = mask[static_cast<size_t>(((b * c.Hq + h) * c.S + i) * c.S + j)] * r;
          double dpd = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            out.o[qi(b, i, h) + d] += prob[j] * keep * v[ki(b, j, g) + d];
            dpd += dout[qi(b, i, h) + d] * static_cast<double>(v[ki(b, j, g) + d]);
            out.dv[ki(b, j, g) + d] += prob[j] * keep * dout[qi(b, i, h) + d];
          }
          dp[j] = dpd * keep;
          sum_pdp += prob[j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = prob[j] * (dp[j] - sum_pdp) * scale;
          if (ds == 0) continue;
          for (int64_t d = 0; d < c.D; ++d) {
            out.dq[qi(b, i, h) + d] += ds * k[ki(b, j, g) + d];
            out.dk[ki(b, j, g) + d] += ds * q[qi(b, i, h) + d];
          }
        }
      }
    }
  }
  return out;
}

void test_case(const Case& c) {
  const std::string name = "attention dropout " + c.name();
  if (c.S > c.D) throw std::logic_error("the one-hot read-back needs S <= D");
  try {
    Run run(c);
    const uint64_t seed = 0x9e3779b97f4a7c15ULL ^ static_cast<uint64_t>(c.S * 131 + c.Hq);
    const std::vector<int> mask = read_mask(run, c, seed), again = read_mask(run, c, seed), other = read_mask(run, c, seed + 1);
    int64_t visible_n = 0, kept = 0, unclear = 0, differ = 0;
    const std::vector<int32_t> starts = c.documents ? document_starts(c) : std::vector<int32_t>();
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t i = 0; i < c.S; ++i) {
          for (int64_t j = 0; j < c.S; ++j) {
            if (!visible(c, starts, b, i, j)) continue;
            const size_t at = static_cast<size_t>(((b * c.Hq + h) * c.S + i) * c.S + j);
            ++visible_n;
            kept += mask[at] == 1;
            unclear += mask[at] < 0;
            differ += mask[at] != other[at];
          }
        }
      }
    }
    const double fraction = static_cast<double>(kept) / static_cast<double>(visible_n);
    const double noise = std::sqrt(c.p * (1 - c.p) / static_cast<double>(visible_n));
    char buf[320];
    std::snprintf(buf, sizeof(buf), "%s: the mask read back: %lld of %lld probabilities kept (%.4f, expected %.4f +- %.4f), %lld neither kept nor "
                  "dropped, the same seed %s, another seed changes %lld",
                  name.c_str(), static_cast<long long>(kept), static_cast<long long>(visible_n), fraction, 1 - c.p, 5 * noise,
                  static_cast<long long>(unclear), mask == again ? "the same mask" : "ANOTHER mask", static_cast<long long>(differ));
    check(unclear == 0 && std::fabs(fraction - (1 - c.p)) < 5 * noise && mask == again && differ > visible_n * c.p / 2, buf);

    const size_t nq = static_cast<size_t>(c.B * c.S * c.Hq * c.D), nk = static_cast<size_t>(c.B * c.S * c.Hk * c.D);
    const auto q = random_bf16_values(nq, 21), k = random_bf16_values(nk, 22), v = random_bf16_values(nk, 23), dout = random_bf16_values(nq, 24);
    run.set(q, k, v, dout);
    const std::vector<float> o = run.forward(seed);
    const std::vector<std::vector<float>> grads = run.backward(seed);
    const Reference ref = reference(c, mask, q, k, v, dout);
    const double eo = rel_err(o, ref.o), eq = rel_err(grads[0], ref.dq), ek = rel_err(grads[1], ref.dk), ev = rel_err(grads[2], ref.dv);
    std::snprintf(buf, sizeof(buf), "%s: against fp64 with that mask: O %.2e dQ %.2e dK %.2e dV %.2e (max error / max value)", name.c_str(), eo, eq,
                  ek, ev);
    check(eo < 2e-2 && eq < 3e-2 && ek < 3e-2 && ev < 3e-2, buf);
  } catch (const std::exception& e) {
    check(false, name + ": " + e.what());
  }
}

}  // namespace

int main() {
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible\n");
    return 77;
  }
  test_case({2, 64, 4, 2, 64, 0.1f});
  test_case({2, 64, 4, 4, 64, 0.3f, false, true});
  test_case({1, 128, 2, 1, 128, 0.2f});
  test_case({2, 64, 4, 2, 64, 0.1f, true});
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
