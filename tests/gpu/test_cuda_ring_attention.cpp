// test_cuda_ring_attention.cpp: context parallelism's ring attention on one GPU (kernels/cuda/context_attention.h):
// for CP = 2 and 4, the CP ranks' shares of each sequence (Megatron's load-balanced chunks r and 2 CP - 1 - r) are
// laid out in one process, each rank's queries meet every rank's keys and values block by block in the ring's order,
// the blocks merge by their log-sum-exp, and the backward runs block by block into each owner's gradients. Output
// and dQ, dK, dV are checked against the CPU's whole-sequence causal attention (kernels/cpu/attention.h), with
// grouped-query heads, in bf16's tolerance. Exit 77 (skipped) where no GPU is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_check.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/context_attention.h"
#include "tensor/device_info.h"
#include "tensor/dtype.h"
#include "tensor/rng.h"

namespace {

using mt::test::check;
using mt::test::download;
using mt::test::failures;
using mt::test::random_bf16_values;
using mt::test::to_16;
using mt::test::upload;

// Rank r's rows of a [B, S, H, D] tensor: chunks r and 2n - 1 - r of each sample (c rows each), in that order.
std::vector<float> rank_rows(const std::vector<float>& whole, int64_t B, int64_t S, int64_t width, int64_t n, int64_t r) {
  const int64_t c = S / (2 * n);
  std::vector<float> out;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t chunk : {r, 2 * n - 1 - r}) {
      const auto* p = whole.data() + (b * S + chunk * c) * width;
      out.insert(out.end(), p, p + c * width);
    }
  }
  return out;
}

// The worst over the runs of `run` values (a chunk of one sample: what one block kind acts on) of max |a - b| / max |b|
// in the run; infinite where a holds a value that is not finite.
double rel_err(const std::vector<float>& a, const std::vector<float>& b, size_t run) {
  double worst = 0;
  for (size_t r0 = 0; r0 < a.size(); r0 += run) {
    double num = 0, den = 1e-30;
    for (size_t i = r0; i < std::min(a.size(), r0 + run); ++i) {
      if (!std::isfinite(a[i])) return INFINITY;
      num = std::max(num, static_cast<double>(std::fabs(a[i] - b[i])));
      den = std::max(den, static_cast<double>(std::fabs(b[i])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

void test_ring(int64_t n, int64_t B, int64_t c, int64_t Hq, int64_t Hk, int64_t D) {
  namespace cu = mt::cuda;
  const int64_t S = 2 * n * c, R = 2 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const auto nq = static_cast<size_t>(B * S * Hq * D), nk = static_cast<size_t>(B * S * Hk * D);
  const auto q = random_bf16_values(nq, 11), k = random_bf16_values(nk, 12), v = random_bf16_values(nk, 13), dout = random_bf16_values(nq, 14);
  // The whole sequence on the CPU (fp32).
  mt::cpu::AttentionShape sh{B, S, Hq, Hk, D, scale, 0.0f, 0, 0, 0};
  std::vector<float> o(nq), probs(static_cast<size_t>(B * Hq * S * S)), dq(nq), dk(nk), dv(nk), scratch(static_cast<size_t>(S * S));
  mt::cpu::attention_forward(o.data(), probs.data(), q.data(), k.data(), v.data(), sh);
  mt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(), k.data(), v.data(), sh, scratch.data());
  // Each rank's rows on the device.
  const auto lq = static_cast<size_t>(B * R * Hq * D), lk = static_cast<size_t>(B * R * Hk * D), ll = static_cast<size_t>(B * Hq * R);
  std::vector<cu::bf16*> q_dev, k_dev, v_dev, dout_dev, out_dev;
  std::vector<float*> acc, acc_lse, gdq, gdk, gdv;
  for (int64_t r = 0; r < n; ++r) {
    q_dev.push_back(reinterpret_cast<cu::bf16*>(upload(to_16(rank_rows(q, B, S, Hq * D, n, r)))));
    k_dev.push_back(reinterpret_cast<cu::bf16*>(upload(to_16(rank_rows(k, B, S, Hk * D, n, r)))));
    v_dev.push_back(reinterpret_cast<cu::bf16*>(upload(to_16(rank_rows(v, B, S, Hk * D, n, r)))));
    dout_dev.push_back(reinterpret_cast<cu::bf16*>(upload(to_16(rank_rows(dout, B, S, Hq * D, n, r)))));
    out_dev.push_back(reinterpret_cast<cu::bf16*>(upload(std::vector<uint16_t>(lq))));
    acc.push_back(upload(std::vector<float>(lq)));
    acc_lse.push_back(upload(std::vector<float>(ll)));
    gdq.push_back(upload(std::vector<float>(lq)));
    gdk.push_back(upload(std::vector<float>(lk)));
    gdv.push_back(upload(std::vector<float>(lk)));
  }
  cu::RingScratch rs;
  rs.out = reinterpret_cast<cu::bf16*>(upload(std::vector<uint16_t>(lq)));
  rs.lse = upload(std::vector<float>(ll));
  rs.dq = reinterpret_cast<cu::bf16*>(upload(std::vector<uint16_t>(lq)));
  rs.dk = reinterpret_cast<cu::bf16*>(upload(std::vector<uint16_t>(lk)));
  rs.dv = reinterpret_cast<cu::bf16*>(upload(std::vector<uint16_t>(lk)));
  const cu::RingShape rshape{B, c, Hq, Hk, D, scale, cu::F16::kBF16};
  char name[128];
  std::snprintf(name, sizeof(name), "ring attention CP %lld (B %lld, chunks of %lld, heads %lld/%lld, D %lld)", static_cast<long long>(n),
                static_cast<long long>(B), static_cast<long long>(c), static_cast<long long>(Hq), static_cast<long long>(Hk),
                static_cast<long long>(D));
  try {
    for (int64_t r = 0; r < n; ++r) {  // the ring's order: the rank's own block, then rank r - 1's, r - 2's, ...
      for (int64_t i = 0; i < n; ++i) {
        const int64_t src = (r - i + n) % n;
        cu::ring_block_forward(rshape, cu::ring_block(r, src), q_dev[r], k_dev[src], v_dev[src], rs, acc[r], acc_lse[r], i == 0, nullptr);
      }
      cu::ring_output(rshape, acc[r], out_dev[r], nullptr);  // the merged output, 16-bit (the backward reads it)
    }
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t src = (r - i + n) % n;
        cu::ring_block_backward(rshape, cu::ring_block(r, src), q_dev[r], k_dev[src], v_dev[src], out_dev[r], dout_dev[r], acc_lse[r], rs, gdq[r], gdk[src],
                                gdv[src], nullptr);
      }
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
    double eo = 0, eq = 0, ek = 0, ev = 0;
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<uint16_t> out16 = download(reinterpret_cast<const uint16_t*>(out_dev[r]), lq);
      std::vector<float> got_o(lq);
      for (size_t i = 0; i < lq; ++i) got_o[i] = mt::bf16_to_float(out16[i]);
      const auto qrun = static_cast<size_t>(c * Hq * D), krun = static_cast<size_t>(c * Hk * D);
      eo = std::max(eo, rel_err(got_o, rank_rows(o, B, S, Hq * D, n, r), qrun));
      eq = std::max(eq, rel_err(download(gdq[r], lq), rank_rows(dq, B, S, Hq * D, n, r), qrun));
      ek = std::max(ek, rel_err(download(gdk[r], lk), rank_rows(dk, B, S, Hk * D, n, r), krun));
      ev = std::max(ev, rel_err(download(gdv[r], lk), rank_rows(dv, B, S, Hk * D, n, r), krun));
    }
    char buf[320];
    std::snprintf(buf, sizeof(buf), "%s against the whole sequence: O %.2e dQ %.2e dK %.2e dV %.2e (max error / max value, worst chunk)", name, eo, eq, ek, ev);
    check(eo < 2e-2 && eq < 3e-2 && ek < 3e-2 && ev < 3e-2, buf);
  } catch (const std::exception& ex) {
    check(false, std::string(name) + ": " + ex.what());
  }
  for (auto& list : {q_dev, k_dev, v_dev, dout_dev, out_dev}) {
    for (auto* p : list) cudaFree(p);
  }
  for (auto& list : {acc, acc_lse, gdq, gdk, gdv}) {
    for (auto* p : list) cudaFree(p);
  }
  for (void* p : {static_cast<void*>(rs.out), static_cast<void*>(rs.lse), static_cast<void*>(rs.dq), static_cast<void*>(rs.dk),
                  static_cast<void*>(rs.dv)}) {
    cudaFree(p);
  }
}

}  // namespace

int main() {
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible (%s)\n", mt::gpu_unavailable_reason().c_str());
    return 77;
  }
  test_ring(2, 2, 64, 4, 2, 64);
  test_ring(4, 2, 64, 4, 2, 64);
  test_ring(4, 1, 128, 8, 8, 128);
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
