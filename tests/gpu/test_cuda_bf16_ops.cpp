// test_cuda_bf16_ops.cpp: the mixed-precision kernels of the CUDA engine against the CPU reference on the
// same 16-bit-rounded inputs, each in bf16 and again in fp16 (odd sizes, and the vectorised fast paths'
// sizes): fused add + LayerNorm / RMSNorm forward and backward, the QKV split / merge with RoPE, GELU and
// SwiGLU, fused cross-entropy, the GEMM epilogues, bias gradients, the embedding lookup, the device-side
// AdamW step, and fp16's device-side loss scaler. Tolerances fit bf16 outputs.
// Exit 77 (skipped, with a message) where no GPU is visible.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/config.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/router.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/cross_entropy_bf16.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/embedding_bf16.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/mla_layout.h"
#include "kernels/cuda/moe.h"
#include "model/moe_random_logits.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/optimizer_step.h"
#include "kernels/cuda/qkv_layout.h"
#include "kernels/cuda/rope.h"
#include "optim/host_adam.h"
#include "optim/loss_scaler.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/dtype.h"

using namespace mt;
using Vec = std::vector<float>;
using cuda::bf16;

namespace {

int failures = 0;
std::mt19937 rng(99);
// The 16-bit type under test: every op runs once in bf16 and once in fp16 (main), the CPU reference on
// inputs rounded to that type.
cuda::F16 g_t = cuda::F16::kBF16;
uint16_t to16(float x) { return g_t == cuda::F16::kFP16 ? float_to_fp16(x) : float_to_bf16(x); }
float from16(uint16_t h) { return g_t == cuda::F16::kFP16 ? fp16_to_float(h) : bf16_to_float(h); }
float round16(float x) { return from16(to16(x)); }
cudaDataType_t g_ab() { return g_t == cuda::F16::kFP16 ? CUDA_R_16F : CUDA_R_16BF; }

Vec randn(size_t n, float scale = 1.0f, bool round = true) {
  std::normal_distribution<float> d(0.0f, scale);
  Vec v(n);
  for (auto& x : v) x = round ? round16(d(rng)) : d(rng);
  return v;
}

template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n;
  explicit Buf(size_t count) : n(count) {
    MT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    MT_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T)));  // poison: NaN in both float and bf16
  }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

struct F32 : Buf<float> {
  explicit F32(size_t n) : Buf(n) {}
  explicit F32(const Vec& v) : Buf(v.size()) { MT_CUDA_CHECK(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice)); }
  Vec get() const {
    Vec v(n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
};

struct B16 : Buf<uint16_t> {
  explicit B16(size_t n) : Buf(n) {}
  explicit B16(const Vec& v) : Buf(v.size()) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = to16(v[i]);
    MT_CUDA_CHECK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  }
  bf16* b() const { return reinterpret_cast<bf16*>(p); }
  Vec get() const {
    std::vector<uint16_t> h(n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    Vec v(n);
    for (size_t i = 0; i < n; ++i) v[i] = from16(h[i]);
    return v;
  }
};

// max |a - b| / max(|b|) (NaN fails).
void expect(const std::string& what, const Vec& got, const Vec& want, double tol) {
  double num = 0, den = 1e-30;
  bool finite = got.size() == want.size();
  for (size_t i = 0; finite && i < got.size(); ++i) {
    if (!std::isfinite(got[i])) finite = false;
    num = std::max(num, static_cast<double>(std::fabs(got[i] - want[i])));
    den = std::max(den, static_cast<double>(std::fabs(want[i])));
  }
  const double err = finite ? num / den : INFINITY;
  const bool ok = err <= tol;
  const std::string name = (g_t == cuda::F16::kFP16 ? "[fp16] " : "") + what;
  std::printf("%-4s %-48s max error %.2e (tolerance %.0e)\n", ok ? "ok" : "FAIL", name.c_str(), err, tol);
  if (!ok) ++failures;
}

Vec rounded16(Vec v) {
  for (auto& x : v) x = round16(x);
  return v;
}

// res16: the residual stream (x and the stored sum) in the 16-bit type, the sum rounded before the norm.
void test_norm(int64_t N, int64_t h, bool rms, bool res16 = false) {
  const std::string tag = std::string(rms ? "rmsnorm" : "layernorm") + " " + std::to_string(N) + "x" + std::to_string(h) + (res16 ? " res16" : "");
  Vec x = randn(static_cast<size_t>(N * h), 1.0f, res16), delta = randn(x.size()), w = randn(static_cast<size_t>(h)), b = randn(w.size(), 0.1f);
  Vec s(x.size()), y(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
  for (size_t i = 0; i < x.size(); ++i) s[i] = res16 ? round16(x[i] + delta[i]) : x[i] + delta[i];
  if (rms) cpu::rmsnorm_forward(y.data(), rstd.data(), s.data(), w.data(), N, h, 1e-5f);
  else cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), s.data(), w.data(), b.data(), N, h, 1e-5f);
  F32 dx(x), dsum(x.size()), dmean(mean.size()), drstd(rstd.size());
  B16 dx16(x), dsum16(x.size());
  void* sum_p = res16 ? static_cast<void*>(dsum16.b()) : static_cast<void*>(dsum.p);
  const void* x_p = res16 ? static_cast<const void*>(dx16.b()) : static_cast<const void*>(dx.p);
  B16 ddelta(delta), dw(w), db(b), dy(y.size());
  cuda::add_norm_forward({.sum_out = sum_p, .y = dy.b(), .mean = rms ? nullptr : dmean.p, .rstd = drstd.p, .x = x_p, .delta = ddelta.b(),
                          .w = dw.b(), .b = rms ? nullptr : db.b(), .rows = N, .width = h, .eps = 1e-5f, .rms = rms, .type = g_t, .res16 = res16}, nullptr);
  expect(tag + " forward (sum)", res16 ? dsum16.get() : dsum.get(), s, 1e-6);
  expect(tag + " forward", dy.get(), y, 1e-2);
  // Backward: dres += dx, dres16 its copy, dw/db accumulate.
  Vec dout = randn(x.size()), dres0 = randn(x.size(), 1.0f, false);
  Vec gx(x.size()), gw(w.size(), 0.5f), gb(w.size(), 0.25f);
  if (rms) cpu::rmsnorm_backward(gx.data(), gw.data(), dout.data(), s.data(), w.data(), rstd.data(), N, h);
  else cpu::layernorm_backward(gx.data(), gw.data(), gb.data(), dout.data(), s.data(), w.data(), mean.data(), rstd.data(), N, h);
  Vec want_res(x.size());
  for (size_t i = 0; i < x.size(); ++i) want_res[i] = dres0[i] + gx[i];
  F32 dres(dres0), gdw(Vec(w.size(), 0.5f)), gdb(Vec(w.size(), 0.25f));
  B16 dres16(x.size()), ddout(dout);
  if (rms) {
    const Vec m0(static_cast<size_t>(N), 0.0f);
    F32 mz(m0);
    cuda::norm_backward_add({.dres = dres.p, .dres16 = dres16.b(), .dw = gdw.p, .db = nullptr, .dy = ddout.b(), .x = sum_p, .mean = mz.p,
                             .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = true, .type = g_t, .res16 = res16}, nullptr);
  } else {
    cuda::norm_backward_add({.dres = dres.p, .dres16 = dres16.b(), .dw = gdw.p, .db = gdb.p, .dy = ddout.b(), .x = sum_p, .mean = dmean.p,
                             .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = false, .type = g_t, .res16 = res16}, nullptr);
  }
  expect(tag + " backward dx", dres.get(), want_res, 2e-3);
  expect(tag + " backward dx (bf16 copy)", dres16.get(), rounded16(want_res), 1e-2);
  expect(tag + " backward dw", gdw.get(), gw, 2e-3);
  if (!rms) expect(tag + " backward db", gdb.get(), gb, 2e-3);
  // The same with the caller's scratch for the weight-gradient partials (the split TP backward's norms, off
  // the compute stream): identical to the allocator's.
  F32 dres_s(dres0), gdw_s(Vec(w.size(), 0.5f)), gdb_s(Vec(w.size(), 0.25f)), part(static_cast<size_t>(cuda::norm_backward_partials(h)));
  B16 dres16_s(x.size());
  if (rms) {
    const Vec m0(static_cast<size_t>(N), 0.0f);
    F32 mz(m0);
    cuda::norm_backward_add({.dres = dres_s.p, .dres16 = dres16_s.b(), .dw = gdw_s.p, .db = nullptr, .dy = ddout.b(), .x = sum_p, .mean = mz.p,
                             .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = true, .type = g_t, .res16 = res16, .dropout = nullptr,
                             .partials = part.p}, nullptr);
  } else {
    cuda::norm_backward_add({.dres = dres_s.p, .dres16 = dres16_s.b(), .dw = gdw_s.p, .db = gdb_s.p, .dy = ddout.b(), .x = sum_p, .mean = dmean.p,
                             .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = false, .type = g_t, .res16 = res16, .dropout = nullptr,
                             .partials = part.p}, nullptr);
  }
  expect(tag + " backward with scratch dx", dres_s.get(), dres.get(), 0.0);
  expect(tag + " backward with scratch dw", gdw_s.get(), gdw.get(), 0.0);
  if (!rms) expect(tag + " backward with scratch db", gdb_s.get(), gdb.get(), 0.0);
}

// The split TP layers under SP: the norms given `count` partial blocks `stride` apart (an all-to-all's
// output) must match the same norms given their sum rounded to the 16-bit type (what a reduce-scatter
// delivers), bit for bit.
void test_norm_partials(int64_t N, int64_t h, bool rms, bool res16, int count, int64_t pad) {
  const std::string tag = std::string(rms ? "rmsnorm" : "layernorm") + " " + std::to_string(N) + "x" + std::to_string(h) + " " +
                          std::to_string(count) + " partial sums" + (res16 ? " res16" : "");
  const int64_t n = N * h, stride = n + pad;
  const cuda::Partials parts{count, stride};
  Vec x = randn(static_cast<size_t>(n), 1.0f, res16), w = randn(static_cast<size_t>(h)), b = randn(w.size(), 0.1f);
  Vec blocks(static_cast<size_t>(stride * count), 0.0f), dblocks(blocks.size(), 0.0f), sum(static_cast<size_t>(n)), dsum(sum.size());
  for (int k = 0; k < count; ++k) {
    const Vec d = randn(static_cast<size_t>(n)), g = randn(static_cast<size_t>(n));
    std::copy(d.begin(), d.end(), blocks.begin() + k * stride);
    std::copy(g.begin(), g.end(), dblocks.begin() + k * stride);
  }
  for (int64_t i = 0; i < n; ++i) {
    float a = 0.0f, c = 0.0f;
    for (int k = 0; k < count; ++k) a += blocks[static_cast<size_t>(k * stride + i)], c += dblocks[static_cast<size_t>(k * stride + i)];
    sum[static_cast<size_t>(i)] = round16(a);
    dsum[static_cast<size_t>(i)] = round16(c);
  }
  F32 dx(x), s_one(x.size()), s_parts(x.size()), dmean(static_cast<size_t>(N)), drstd(static_cast<size_t>(N));
  B16 dx16(x), s16_one(x.size()), s16_parts(x.size());
  const void* x_p = res16 ? static_cast<const void*>(dx16.b()) : static_cast<const void*>(dx.p);
  void* so_one = res16 ? static_cast<void*>(s16_one.b()) : static_cast<void*>(s_one.p);
  void* so_parts = res16 ? static_cast<void*>(s16_parts.b()) : static_cast<void*>(s_parts.p);
  B16 dblk(blocks), dsm(sum), dw(w), db(b), y_one(x.size()), y_parts(x.size());
  float* mean = rms ? nullptr : dmean.p;
  cuda::add_norm_forward({.sum_out = so_one, .y = y_one.b(), .mean = mean, .rstd = drstd.p, .x = x_p, .delta = dsm.b(), .w = dw.b(),
                          .b = rms ? nullptr : db.b(), .rows = N, .width = h, .eps = 1e-5f, .rms = rms, .type = g_t, .res16 = res16}, nullptr);
  cuda::add_norm_forward({.sum_out = so_parts, .y = y_parts.b(), .mean = mean, .rstd = drstd.p, .x = x_p, .delta = dblk.b(), .w = dw.b(),
                          .b = rms ? nullptr : db.b(), .rows = N, .width = h, .eps = 1e-5f, .rms = rms, .type = g_t, .res16 = res16,
                          .dropout = nullptr, .parts = parts}, nullptr);
  expect(tag + " forward", y_parts.get(), y_one.get(), 0.0);
  expect(tag + " forward (sum)", res16 ? s16_parts.get() : s_parts.get(), res16 ? s16_one.get() : s_one.get(), 0.0);
  const Vec dres0 = randn(x.size(), 1.0f, false), zero(static_cast<size_t>(N), 0.0f);
  F32 mz(zero), res_one(dres0), res_parts(dres0), gw_one(Vec(w.size(), 0.5f)), gw_parts(Vec(w.size(), 0.5f)), gb_one(Vec(w.size(), 0.25f)),
      gb_parts(Vec(w.size(), 0.25f)), part(static_cast<size_t>(cuda::norm_backward_partials(h)));
  B16 ddblk(dblocks), ddsm(dsum), r16_one(x.size()), r16_parts(x.size());
  const float* m = rms ? mz.p : dmean.p;
  cuda::norm_backward_add({.dres = res_one.p, .dres16 = r16_one.b(), .dw = gw_one.p, .db = rms ? nullptr : gb_one.p, .dy = ddsm.b(), .x = so_one,
                           .mean = m, .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = rms, .type = g_t, .res16 = res16,
                           .dropout = nullptr, .partials = part.p}, nullptr);
  cuda::norm_backward_add({.dres = res_parts.p, .dres16 = r16_parts.b(), .dw = gw_parts.p, .db = rms ? nullptr : gb_parts.p, .dy = ddblk.b(),
                           .x = so_one, .mean = m, .rstd = drstd.p, .w = dw.b(), .rows = N, .width = h, .rms = rms, .type = g_t, .res16 = res16,
                           .dropout = nullptr, .partials = part.p, .parts = parts}, nullptr);
  expect(tag + " backward dx", res_parts.get(), res_one.get(), 0.0);
  expect(tag + " backward dx (16-bit copy)", r16_parts.get(), r16_one.get(), 0.0);
  expect(tag + " backward dw", gw_parts.get(), gw_one.get(), 0.0);
  if (!rms) expect(tag + " backward db", gb_parts.get(), gb_one.get(), 0.0);
}

void test_qkv(int64_t T, int64_t nh, int64_t ng, int64_t d, int64_t rot, bool rope, bool interleaved = false) {
  const std::string tag = "qkv split/merge T" + std::to_string(T) + " " + std::to_string(nh) + "/" + std::to_string(ng) + " d" +
                          std::to_string(d) + (rope ? " rope " + std::to_string(rot) : "") + (interleaved ? " interleaved" : "");
  const int64_t W = (nh + 2 * ng) * d;
  Vec qkv = randn(static_cast<size_t>(T * W));
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = static_cast<int32_t>((t * 7) % 61);
  Vec q(static_cast<size_t>(T * nh * d)), k(static_cast<size_t>(T * ng * d)), v(k.size());
  cpu::qkv_split(q.data(), k.data(), v.data(), qkv.data(), T, nh, ng, d);
  if (rope) {
    cpu::rope_forward(q.data(), pos.data(), T, nh, d, rot, 10000.0f, interleaved);
    cpu::rope_forward(k.data(), pos.data(), T, ng, d, rot, 10000.0f, interleaved);
  }
  const auto table = cuda::rope_table(64, rot, 10000.0);
  F32 dtable(table);
  int32_t* dpos = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&dpos, pos.size() * 4));
  MT_CUDA_CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  B16 dqkv(qkv), dq(q.size()), dk(k.size()), dv(v.size());
  cuda::qkv_split_rope({.q = dq.b(), .k = dk.b(), .v = dv.b(), .qkv = dqkv.b(), .positions = dpos, .table = rope ? dtable.p : nullptr, .rows = T,
                        .heads = nh, .groups = ng, .head_dim = d, .rot_dim = rot, .type = g_t, .interleaved = interleaved}, nullptr);
  expect(tag + " Q", dq.get(), q, 1e-2);
  if (rope) {  // (the rotation alone on separate heads: rope_apply_16, as --qk-layernorm runs it)
    Vec q0(q.size()), k0(k.size()), v0(v.size());
    cpu::qkv_split(q0.data(), k0.data(), v0.data(), qkv.data(), T, nh, ng, d);
    B16 dq0(q0);
    cuda::rope_apply_16(dq0.b(), dpos, dtable.p, T, nh, d, rot, 1.0f, nullptr, g_t, interleaved);
    expect(tag + " Q (rope_apply_16)", dq0.get(), q, 1e-2);
  }
  expect(tag + " K", dk.get(), k, 1e-2);
  expect(tag + " V", dv.get(), v, 1e-6);
  // Backward: gradients through the inverse rotation into the fused layout.
  Vec gq = randn(q.size()), gk = randn(k.size()), gv = randn(v.size());
  B16 dgq(gq), dgk(gk), dgv(gv), dout(qkv.size());
  Vec rq = gq, rk = gk, want(qkv.size());
  if (rope) {
    cpu::rope_backward(rq.data(), pos.data(), T, nh, d, rot, 10000.0f, interleaved);
    cpu::rope_backward(rk.data(), pos.data(), T, ng, d, rot, 10000.0f, interleaved);
  }
  cpu::qkv_merge(want.data(), rq.data(), rk.data(), gv.data(), T, nh, ng, d);
  cuda::qkv_merge_rope_backward({.dqkv = dout.b(), .dq = dgq.b(), .dk = dgk.b(), .dv = dgv.b(), .positions = dpos,
                                 .table = rope ? dtable.p : nullptr, .rows = T, .heads = nh, .groups = ng, .head_dim = d, .rot_dim = rot,
                                 .type = g_t, .interleaved = interleaved}, nullptr);
  expect(tag + " backward", dout.get(), want, 1e-2);
  cudaFree(dpos);
}

// Multi-latent attention's heads (kernels/cuda/mla_layout.h) against plain loops: the keys and values copied exactly, the
// key / value gradients back exactly, k_pe's gradient the heads' sum in fp32 in head order, rounded once (exactly).
// Widths that are multiples of 8 take the vector kernels, the others the scalar ones.
void test_mla_heads(int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv) {
  const std::string tag = "MLA heads T" + std::to_string(T) + " H" + std::to_string(H) + " " + std::to_string(dn) + "+" + std::to_string(dr) + "/" +
                          std::to_string(dv);
  const Vec kv = rounded16(randn(static_cast<size_t>(T * H * (dn + dv)))), k_pe = rounded16(randn(static_cast<size_t>(T * dr)));
  Vec k(static_cast<size_t>(T * H * (dn + dr))), v(static_cast<size_t>(T * H * dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      const int64_t i = t * H + j;
      for (int64_t c = 0; c < dn; ++c) k[static_cast<size_t>(i * (dn + dr) + c)] = kv[static_cast<size_t>(i * (dn + dv) + c)];
      for (int64_t c = 0; c < dr; ++c) k[static_cast<size_t>(i * (dn + dr) + dn + c)] = k_pe[static_cast<size_t>(t * dr + c)];
      for (int64_t c = 0; c < dv; ++c) v[static_cast<size_t>(i * dv + c)] = kv[static_cast<size_t>(i * (dn + dv) + dn + c)];
    }
  }
  const cuda::MlaHeads shape{T, H, dn, dr, dv, g_t};
  B16 dkv(kv), dk_pe(k_pe), dk(k.size()), dvv(v.size());
  cuda::mla_keys_values(dk.b(), dvv.b(), dkv.b(), dk_pe.b(), shape, nullptr);
  expect(tag + " keys", dk.get(), k, 0.0);
  expect(tag + " values", dvv.get(), v, 0.0);
  const Vec gk = rounded16(randn(k.size())), gv = rounded16(randn(v.size()));
  Vec gkv(kv.size()), gpe(k_pe.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < dr; ++c) {
      float sum = 0.0f;
      for (int64_t j = 0; j < H; ++j) sum += gk[static_cast<size_t>((t * H + j) * (dn + dr) + dn + c)];
      gpe[static_cast<size_t>(t * dr + c)] = round16(sum);
    }
    for (int64_t j = 0; j < H; ++j) {
      const int64_t i = t * H + j;
      for (int64_t c = 0; c < dn; ++c) gkv[static_cast<size_t>(i * (dn + dv) + c)] = gk[static_cast<size_t>(i * (dn + dr) + c)];
      for (int64_t c = 0; c < dv; ++c) gkv[static_cast<size_t>(i * (dn + dv) + dn + c)] = gv[static_cast<size_t>(i * dv + c)];
    }
  }
  B16 dgk(gk), dgv(gv), dgkv(kv.size()), dgpe(k_pe.size());
  cuda::mla_keys_values_backward(dgkv.b(), dgpe.b(), dgk.b(), dgv.b(), shape, nullptr);
  expect(tag + " key / value gradients", dgkv.get(), gkv, 0.0);
  expect(tag + " k_pe's gradient", dgpe.get(), gpe, 0.0);
}

void test_activations(int64_t N, int64_t F) {
  const std::string tag = std::to_string(N) + "x" + std::to_string(F);
  Vec x = randn(static_cast<size_t>(N * F)), y(x.size()), dy = randn(x.size()), dx(x.size());
  cpu::gelu_forward(y.data(), x.data(), N * F);
  cpu::gelu_backward(dx.data(), dy.data(), x.data(), N * F);
  B16 gx(x), gy(x.size()), gdy(dy), gdx(x.size());
  cuda::gelu_forward_bf16(gy.b(), gx.b(), N * F, nullptr, g_t);
  cuda::gelu_backward_bf16(gdx.b(), gdy.b(), gx.b(), N * F, nullptr, g_t);
  expect("gelu forward " + tag, gy.get(), y, 1e-2);
  expect("gelu backward " + tag, gdx.get(), dx, 1e-2);
  // (GELU's exact erf form, Megatron's activation without the bias-GELU fusion)
  cpu::gelu_erf_forward(y.data(), x.data(), N * F);
  cpu::gelu_erf_backward(dx.data(), dy.data(), x.data(), N * F);
  cuda::gelu_forward_bf16(gy.b(), gx.b(), N * F, nullptr, g_t, true);
  cuda::gelu_backward_bf16(gdx.b(), gdy.b(), gx.b(), N * F, nullptr, g_t, true);
  expect("gelu erf forward " + tag, gy.get(), y, 1e-2);
  expect("gelu erf backward " + tag, gdx.get(), dx, 1e-2);
  cpu::squared_relu_forward(y.data(), x.data(), N * F);
  cpu::squared_relu_backward(dx.data(), dy.data(), x.data(), N * F);
  cuda::squared_relu_forward_bf16(gy.b(), gx.b(), N * F, nullptr, g_t);
  cuda::squared_relu_backward_bf16(gdx.b(), gdy.b(), gx.b(), N * F, nullptr, g_t);
  expect("squared relu forward " + tag, gy.get(), y, 1e-2);
  expect("squared relu backward " + tag, gdx.get(), dx, 1e-2);
  Vec x2 = randn(static_cast<size_t>(N * 2 * F)), y2(static_cast<size_t>(N * F)), dx2(x2.size());
  cpu::swiglu_forward(y2.data(), x2.data(), N, F);
  cpu::swiglu_backward(dx2.data(), dy.data(), x2.data(), N, F);
  B16 sx(x2), sy(y2.size()), sdx(x2.size());
  cuda::swiglu_forward_bf16(sy.b(), sx.b(), N, F, nullptr, g_t);
  cuda::swiglu_backward_bf16(sdx.b(), gdy.b(), sx.b(), N, F, nullptr, g_t);
  expect("swiglu forward " + tag, sy.get(), y2, 1e-2);
  expect("swiglu backward " + tag, sdx.get(), dx2, 1e-2);
  // The other gated units (kernels/gated_activation.h): quick GeGLU with GPT-OSS's offset and clamp (the inputs spread
  // wider, so that the clamp holds some of them), and SwiGLU with a clamp.
  Vec x3 = randn(static_cast<size_t>(N * 2 * F), 2.0f);
  B16 qx(x3);
  for (const GatedActivation& a : {GatedActivation{.alpha = kQuickGeluAlpha, .linear_offset = 1.0f, .clamp = 1.5f},
                                   GatedActivation{.alpha = kQuickGeluAlpha}, GatedActivation{.alpha = 1.0f, .linear_offset = 0.0f, .clamp = 1.5f}}) {
    const std::string what = " alpha " + std::to_string(a.alpha) + " offset " + std::to_string(a.linear_offset) + " clamp " + std::to_string(a.clamp);
    cpu::gated_forward(y2.data(), x3.data(), N, F, a);
    cpu::gated_backward(dx2.data(), dy.data(), x3.data(), N, F, a);
    cuda::glu_forward_bf16(sy.b(), qx.b(), N, F, a, nullptr, g_t);
    cuda::glu_backward_bf16(sdx.b(), gdy.b(), qx.b(), N, F, a, nullptr, g_t);
    expect("gated forward " + tag + what, sy.get(), y2, 1e-2);
    expect("gated backward " + tag + what, sdx.get(), dx2, 1e-2);
  }
}

// A cross-entropy case on the CPU reference: random bf16 logits [N, V], targets, a mask with holes, and the
// losses and (mask * scale)-weighted logit gradients.
struct CeCase {
  static constexpr float scale = 0.37f;
  Vec logits, mask, losses, dl;
  std::vector<int32_t> tgt;
  CeCase(int64_t N, int64_t V) : logits(randn(static_cast<size_t>(N * V), 2.0f)), mask(static_cast<size_t>(N)), tgt(static_cast<size_t>(N)) {
    for (int64_t n = 0; n < N; ++n) {
      tgt[static_cast<size_t>(n)] = static_cast<int32_t>((n * 131) % V);
      mask[static_cast<size_t>(n)] = n % 5 == 3 ? 0.0f : 1.0f;
    }
    Vec lse(static_cast<size_t>(N)), dloss(static_cast<size_t>(N));
    losses.resize(static_cast<size_t>(N));
    dl.resize(logits.size());
    cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V);
    for (int64_t n = 0; n < N; ++n) dloss[static_cast<size_t>(n)] = mask[static_cast<size_t>(n)] * scale;
    cpu::cross_entropy_backward(dl.data(), logits.data(), lse.data(), tgt.data(), dloss.data(), N, V);
  }
};

void test_cross_entropy(int64_t N, int64_t V) {
  const std::string tag = "cross-entropy " + std::to_string(N) + "x" + std::to_string(V);
  const CeCase c(N, V);
  const Vec &logits = c.logits, &mask = c.mask, &losses = c.losses, &dl = c.dl;
  const std::vector<int32_t>& tgt = c.tgt;
  const float scale = CeCase::scale;
  B16 dlogits(logits);
  F32 dlosses(losses.size()), dmask(mask), acc(Vec{1.0f});
  int32_t* dt = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&dt, tgt.size() * 4));
  MT_CUDA_CHECK(cudaMemcpy(dt, tgt.data(), tgt.size() * 4, cudaMemcpyHostToDevice));
  cuda::cross_entropy_fused_bf16(dlosses.p, dlogits.b(), dt, dmask.p, scale, N, V, true, nullptr, g_t);
  cuda::masked_loss_sum(acc.p, dlosses.p, dmask.p, N, 0.5f, nullptr);
  expect(tag + " loss", dlosses.get(), losses, 2e-3);
  expect(tag + " gradient (in place)", dlogits.get(), dl, 1e-2);
  double s = 1.0;
  for (int64_t n = 0; n < N; ++n) s += 0.5 * losses[static_cast<size_t>(n)] * mask[static_cast<size_t>(n)];
  expect(tag + " masked sum", acc.get(), Vec{static_cast<float>(s)}, 1e-3);
  cudaFree(dt);
}

// The vocabulary-parallel loss over `shards` column blocks on one GPU, the two TP collectives done on the host
// (max, then sum): losses and the reassembled gradient against the CPU reference on the whole vocabulary.
void test_cross_entropy_sharded(int64_t N, int64_t V, int64_t shards) {
  const std::string tag = "vocab-parallel cross-entropy " + std::to_string(N) + "x" + std::to_string(V) + "/" + std::to_string(shards);
  const int64_t Vl = V / shards;
  const CeCase c(N, V);
  const Vec &logits = c.logits, &mask = c.mask, &losses = c.losses, &dl = c.dl;
  const std::vector<int32_t>& tgt = c.tgt;
  const float scale = CeCase::scale;
  std::vector<std::unique_ptr<B16>> part;
  std::vector<std::unique_ptr<F32>> stats;
  for (int64_t r = 0; r < shards; ++r) {
    Vec cols(static_cast<size_t>(N * Vl));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < Vl; ++c) cols[static_cast<size_t>(n * Vl + c)] = logits[static_cast<size_t>(n * V + r * Vl + c)];
    }
    part.push_back(std::make_unique<B16>(cols));
    stats.push_back(std::make_unique<F32>(static_cast<size_t>(4 * N)));
  }
  F32 dmask(mask), dlosses(losses.size());
  int32_t* dt = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&dt, tgt.size() * 4));
  MT_CUDA_CHECK(cudaMemcpy(dt, tgt.data(), tgt.size() * 4, cudaMemcpyHostToDevice));
  // "all-reduce" over the shards of stats[from, from + n) with op
  auto reduce = [&](int64_t from, int64_t n, bool max) {
    Vec acc(static_cast<size_t>(n), max ? -INFINITY : 0.0f);
    for (auto& st : stats) {
      const Vec v = st->get();
      for (int64_t i = 0; i < n; ++i) {
        const float x = v[static_cast<size_t>(from + i)];
        acc[static_cast<size_t>(i)] = max ? std::max(acc[static_cast<size_t>(i)], x) : acc[static_cast<size_t>(i)] + x;
      }
    }
    for (auto& st : stats) MT_CUDA_CHECK(cudaMemcpy(st->p + from, acc.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  };
  for (int64_t r = 0; r < shards; ++r) cuda::ce_shard_stats(stats[static_cast<size_t>(r)]->p, part[static_cast<size_t>(r)]->b(), dt, N, Vl, r * Vl, nullptr, g_t);
  reduce(0, N, true);
  for (auto& st : stats) cuda::ce_shard_rescale(st->p, N, nullptr);
  reduce(2 * N, 2 * N, false);
  Vec grad(logits.size());
  for (int64_t r = 0; r < shards; ++r) {
    cuda::ce_shard_finish({.losses = dlosses.p, .logits = part[static_cast<size_t>(r)]->b(), .stats = stats[static_cast<size_t>(r)]->p,
                           .targets = dt, .loss_mask = dmask.p, .grad_scale = scale, .rows = N, .vocab_local = Vl, .vocab_start = r * Vl,
                           .write_grad = true, .type = g_t}, nullptr);
    expect(tag + " loss, shard " + std::to_string(r), dlosses.get(), losses, 2e-3);
    const Vec g = part[static_cast<size_t>(r)]->get();
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < Vl; ++c) grad[static_cast<size_t>(n * V + r * Vl + c)] = g[static_cast<size_t>(n * Vl + c)];
    }
  }
  expect(tag + " gradient (in place)", grad, dl, 1e-2);
  cudaFree(dt);
}

// The GELU epilogues of the cuBLASLt GEMM: forward y = gelu(x W^T + b) with the GELU input kept as aux,
// and the data-gradient GEMM dx = (dy W2) * gelu'(aux), against the CPU linear + GELU on the same inputs.
void test_gemm_gelu(int64_t M, int64_t K, int64_t N, int64_t N2) {
  const std::string tag = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
  Vec x = randn(static_cast<size_t>(M * K)), w = randn(static_cast<size_t>(N * K), 0.05f), b = randn(static_cast<size_t>(N), 0.1f);
  Vec pre(static_cast<size_t>(M * N)), y(pre.size());
  cpu::linear_forward(pre.data(), x.data(), w.data(), b.data(), M, K, N);
  cpu::gelu_forward(y.data(), pre.data(), M * N);
  B16 dx(x), dw(w), db(b), dy(pre.size()), daux(pre.size());
  cuda::GemmLt::instance().gemm_ex(false, true, M, N, K, 1.0f, dx.b(), K, dw.b(), K, 0.0f, dy.b(), N, g_ab(), g_ab(), db.b(), nullptr,
                                   {cuda::GemmEpilogue::kGeluAux, daux.b(), N});
  expect("GEMM + bias + GELU epilogue " + tag, dy.get(), y, 1e-2);
  expect("GEMM GELU epilogue: saved input " + tag, daux.get(), pre, 1e-2);
  // Backward: g = dout [M, N2] x W2 [N2, N], then times gelu'(pre) (pre as the GPU saved it).
  Vec dout = randn(static_cast<size_t>(M * N2)), w2 = randn(static_cast<size_t>(N2 * N), 0.05f), g(pre.size()), want(pre.size());
  cpu::gemm(false, false, M, N, N2, 1.0f, dout.data(), N2, w2.data(), N, 0.0f, g.data(), N);
  cpu::gelu_backward(want.data(), g.data(), daux.get().data(), M * N);
  B16 ddout(dout), dw2(w2), dg(pre.size());
  cuda::GemmLt::instance().gemm_ex(false, false, M, N, N2, 1.0f, ddout.b(), N2, dw2.b(), N, 0.0f, dg.b(), N, g_ab(), g_ab(), nullptr, nullptr,
                                   {cuda::GemmEpilogue::kDGelu, daux.b(), N});
  expect("GEMM GELU-backward epilogue " + tag, dg.get(), want, 1e-2);
}

// GEMMs whose rows change from call to call (an MoE expert's; GemmLt's bucketed plans, `varying`): the forward form
// y[n, N] = x[n, K] W[N, K]^T, the data gradient dx[n, K] = dy[n, N] W[N, K] and the weight gradient
// dW[N, K] += dy[n, N]^T x[n, K] (fp32, accumulated; its K the varying rows) at sizes inside one bucket and across
// buckets, largest first (a plan chosen for a bucket's top size runs its smaller sizes too), each against the CPU
// GEMM; and the plans they add: one per bucket and form, not one per size.
void test_gemm_varying(int64_t N, int64_t K) {
  auto& lt = cuda::GemmLt::instance();
  const size_t plans_before = lt.cached_plans();
  const std::vector<int64_t> sizes = {512, 500, 257, 256, 255, 129, 77, 17, 1, 300, 511};  // buckets 512, 256 and 512 again
  const Vec w = randn(static_cast<size_t>(N * K), 0.05f);
  B16 dw(w);
  for (int64_t n : sizes) {
    const std::string tag = std::to_string(n) + "x" + std::to_string(N) + "x" + std::to_string(K);
    const Vec x = randn(static_cast<size_t>(n * K)), dy = randn(static_cast<size_t>(n * N));
    Vec y(static_cast<size_t>(n * N)), dx(static_cast<size_t>(n * K)), gw(static_cast<size_t>(N * K), 0.5f);
    cpu::gemm(false, true, n, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, y.data(), N);
    cpu::gemm(false, false, n, K, N, 1.0f, dy.data(), N, w.data(), K, 0.0f, dx.data(), K);
    cpu::gemm(true, false, N, K, n, 1.0f, dy.data(), N, x.data(), K, 1.0f, gw.data(), K);
    B16 d_x(x), d_dy(dy), d_y(y.size()), d_dx(dx.size());
    F32 d_gw(Vec(static_cast<size_t>(N * K), 0.5f));
    lt.gemm_ex(false, true, n, N, K, 1.0f, d_x.b(), K, dw.b(), K, 0.0f, d_y.b(), N, g_ab(), g_ab(), nullptr, nullptr, {}, true);
    lt.gemm_ex(false, false, n, K, N, 1.0f, d_dy.b(), N, dw.b(), K, 0.0f, d_dx.b(), K, g_ab(), g_ab(), nullptr, nullptr, {}, true);
    lt.gemm_ex(true, false, N, K, n, 1.0f, d_dy.b(), N, d_x.b(), K, 1.0f, d_gw.p, K, g_ab(), CUDA_R_32F, nullptr, nullptr, {}, true);
    expect("varying GEMM forward " + tag, d_y.get(), y, 1e-2);
    expect("varying GEMM data gradient " + tag, d_dx.get(), dx, 1e-2);
    expect("varying GEMM weight gradient " + tag, d_gw.get(), gw, 1e-2);
  }
  const size_t added = lt.cached_plans() - plans_before;
  const bool ok = added <= 6;  // three forms x buckets 256 and 512
  std::printf("%-4s %-48s %zu plans added for %zu sizes (at most 6)\n", ok ? "ok" : "FAIL", "varying GEMM plans", added, sizes.size());
  if (!ok) ++failures;
}

// A weight-gradient GEMM dW[n, h] += dy[T, n]^T x[T, h] with the bias gradient db[n] = sum over T of dy from
// its epilogue (written, not accumulated).
void test_wgrad_bias_epilogue(int64_t T, int64_t n, int64_t h) {
  const std::string tag = std::to_string(T) + "x" + std::to_string(n) + "x" + std::to_string(h);
  Vec dy = randn(static_cast<size_t>(T * n)), x = randn(static_cast<size_t>(T * h)), w0 = randn(static_cast<size_t>(n * h));
  Vec want_w = w0, want_b(static_cast<size_t>(n), 0.0f);
  B16 ddy(dy), dx(x);
  const Vec dyr = ddy.get(), xr = dx.get();  // the bf16-rounded inputs the GPU sees
  cpu::gemm(true, false, n, h, T, 1.0f, dyr.data(), n, xr.data(), h, 1.0f, want_w.data(), h);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < n; ++c) want_b[static_cast<size_t>(c)] += dyr[static_cast<size_t>(t * n + c)];
  }
  F32 dw(w0), db(Vec(static_cast<size_t>(n), 7.0f));
  cuda::GemmLt::instance().gemm_ex(true, false, n, h, T, 1.0f, ddy.b(), n, dx.b(), h, 1.0f, dw.p, h, g_ab(), CUDA_R_32F, nullptr, nullptr,
                                   {cuda::GemmEpilogue::kBiasGrad, db.p, 0});
  expect("weight-gradient GEMM with the bias-gradient epilogue " + tag, dw.get(), want_w, 1e-3);
  expect("bias gradient from the GEMM epilogue " + tag, db.get(), want_b, 1e-3);
}

void test_bias_grad(int64_t N, int64_t n) {
  Vec dy = randn(static_cast<size_t>(N * n)), want(static_cast<size_t>(n), 1.0f);
  for (int64_t r = 0; r < N; ++r) {
    for (int64_t c = 0; c < n; ++c) want[static_cast<size_t>(c)] += dy[static_cast<size_t>(r * n + c)];
  }
  B16 ddy(dy);
  F32 db(Vec(static_cast<size_t>(n), 1.0f));
  cuda::bias_grad_bf16(db.p, ddy.b(), N, n, nullptr, g_t);
  expect("bias gradient " + std::to_string(N) + "x" + std::to_string(n), db.get(), want, 1e-5);
}

void test_embedding(int64_t T, int64_t h, int64_t V, int64_t P) {
  Vec wte = randn(static_cast<size_t>(V * h)), wpe = randn(static_cast<size_t>(P * h)), want(static_cast<size_t>(T * h));
  std::vector<int32_t> tok(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    tok[static_cast<size_t>(t)] = static_cast<int32_t>((t * 37) % V);
    pos[static_cast<size_t>(t)] = static_cast<int32_t>(t % P);
    for (int64_t c = 0; c < h; ++c) {
      want[static_cast<size_t>(t * h + c)] = wte[static_cast<size_t>(tok[static_cast<size_t>(t)] * h + c)] + wpe[static_cast<size_t>(pos[static_cast<size_t>(t)] * h + c)];
    }
  }
  B16 dwte(wte), dwpe(wpe);
  F32 out(want.size());
  int32_t* d = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&d, static_cast<size_t>(2 * T) * 4));
  MT_CUDA_CHECK(cudaMemcpy(d, tok.data(), tok.size() * 4, cudaMemcpyHostToDevice));
  MT_CUDA_CHECK(cudaMemcpy(d + T, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
  cuda::embedding_forward_bf16(out.p, d, d + T, dwte.b(), dwpe.b(), T, h, 0, V, nullptr, g_t);
  expect("embedding lookup " + std::to_string(T) + "x" + std::to_string(h), out.get(), want, 1e-6);
  // A vocabulary shard [v0, V) without positions: other tokens' rows are zero.
  const int64_t v0 = V / 3;
  Vec want_shard(want.size(), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = tok[static_cast<size_t>(t)];
    for (int64_t c = 0; id >= v0 && c < h; ++c) want_shard[static_cast<size_t>(t * h + c)] = wte[static_cast<size_t>(id * h + c)];
  }
  cuda::embedding_forward_bf16(out.p, d, d + T, dwte.b() + v0 * h, nullptr, T, h, v0, V - v0, nullptr, g_t);
  expect("embedding lookup, vocabulary shard", out.get(), want_shard, 1e-6);
  cudaFree(d);
}

// split: where the chunk with weight decay ends and the one without begins. Chunks that start and end on
// multiples of 4 take the kernels' 16-byte path, others the element-wise one; both must give the reference.
void test_adamw(int64_t n, int64_t split) {
  Vec w = randn(static_cast<size_t>(n), 1.0f, false), g = randn(w.size(), 0.1f, false), m = randn(w.size(), 0.01f, false);
  Vec v(w.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::fabs(g[i]) * 0.01f;
  // Two chunks: the first with weight decay, the second without.
  const int64_t half = split;
  const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, clip = 1.0f;
  double ss = 0;
  for (float x : g) ss += static_cast<double>(x) * x;
  const float norm = static_cast<float>(std::sqrt(ss));
  const float coef = norm > clip ? clip / (norm + 1e-6f) : 1.0f;
  Vec ww = w, wm = m, wv = v;
  const float bc1 = 1.0f - b1, bc2 = 1.0f - b2;  // step 1
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const float gi = g[k] * coef;
    wm[k] = b1 * wm[k] + (1 - b1) * gi;
    wv[k] = b2 * wv[k] + (1 - b2) * gi * gi;
    const float upd = (wm[k] / bc1) / (std::sqrt(wv[k] / bc2) + eps);
    ww[k] -= lr * (upd + (i < half ? wd : 0.0f) * ww[k]);
  }
  F32 dw(w), dg(g), dm(m), dv(v), partials(cuda::kNormPartials);
  B16 w16(w.size());
  Buf<cuda::StepState> st(1);
  MT_CUDA_CHECK(cudaMemset(st.p, 0, sizeof(cuda::StepState)));
  std::vector<cuda::AdamChunk> chunks{{0, static_cast<int32_t>(half), 1}, {half, static_cast<int32_t>(n - half), 0}};
  Buf<cuda::AdamChunk> dc(2);
  MT_CUDA_CHECK(cudaMemcpy(dc.p, chunks.data(), 2 * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  cuda::sumsq_partials(partials.p, dg.p, dc.p, 2, false, nullptr);
  cuda::step_prepare(st.p, partials.p, clip, b1, b2, 1.0f, cuda::LossScaleRule{}, nullptr);
  cuda::adamw_multi({.w = dw.p, .m = dm.p, .v = dv.p, .w16 = w16.b(), .g = dg.p, .chunks = dc.p, .count = 2, .state = st.p, .lr = lr, .beta1 = b1,
                     .beta2 = b2, .eps = eps, .weight_decay = wd, .type = g_t}, nullptr);
  cuda::StepState h{};
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  MT_CUDA_CHECK(cudaMemcpy(&h, st.p, sizeof(h), cudaMemcpyDeviceToHost));
  expect("adamw grad norm", Vec{h.grad_norm}, Vec{norm}, 1e-5);
  expect("adamw weights " + std::to_string(n) + " split at " + std::to_string(split), dw.get(), ww, 1e-6);
  expect("adamw bf16 working copy", w16.get(), rounded16(ww), 1e-2);
  expect("adamw moments", dv.get(), wv, 1e-6);
  // Norm weights (a parameter held by every TP rank counts 1/TP on each): the second chunk at weight 1/4.
  chunks[1].norm_weight = 0.25f;
  MT_CUDA_CHECK(cudaMemcpy(dc.p, chunks.data(), 2 * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  cuda::sumsq_partials(partials.p, dg.p, dc.p, 2, false, nullptr);
  double wss = 0;
  for (int64_t i = 0; i < n; ++i) wss += (i < half ? 1.0 : 0.25) * g[static_cast<size_t>(i)] * g[static_cast<size_t>(i)];
  double got = 0;
  for (float x : partials.get()) got += x;
  expect("weighted sum of squares", Vec{static_cast<float>(got)}, Vec{static_cast<float>(wss)}, 1e-5);
}

// Adam's moments stored in bf16 (Megatron's precision-aware optimizer, --exp-avg-dtype / --exp-avg-sq-dtype bf16), each
// combination of the two types, against the offloaded optimizer's host update (host_adamw: fp32 from the stored moments,
// the weights from them unrounded, the stored ones rounded to nearest even). A large rate (1e-2) makes a moment rounded
// before its use move the weights by about 1e-5 of their size, which the 1e-6 tolerance sees; the stored moments equal the
// host's rounding except where a fused multiply-add moves the fp32 value's last bit across a bf16 boundary (rare).
void test_adamw_bf16_moments(int64_t n, int64_t split, bool m_bf16, bool v_bf16) {
  const std::string tag = std::string("adamw moments ") + (m_bf16 ? "bf16" : "fp32") + " / " + (v_bf16 ? "bf16" : "fp32") + " " +
                          std::to_string(n) + " split at " + std::to_string(split);
  Vec w = randn(static_cast<size_t>(n), 1.0f, false), g = randn(w.size(), 0.1f, false), m = randn(w.size(), 0.01f, false);
  Vec v(w.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::fabs(g[i]) * 0.01f;
  for (size_t i = 0; i < v.size(); ++i) {  // (the stored moments: bf16 values where bf16)
    if (m_bf16) m[i] = mt::round_bf16(m[i]);
    if (v_bf16) v[i] = mt::round_bf16(v[i]);
  }
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  double ss = 0;
  for (float x : g) ss += static_cast<double>(x) * x;
  const float norm = static_cast<float>(std::sqrt(ss)), coef = norm > 1.0f ? 1.0f / (norm + 1e-6f) : 1.0f;
  Vec ww = w, wm = m, wv = v;
  std::vector<uint16_t> w16h(w.size());
  mt::HostAdamStep hs;
  hs.lr = lr;
  hs.beta1 = b1;
  hs.beta2 = b2;
  hs.eps = eps;
  hs.weight_decay = wd;
  hs.scale = coef;
  hs.bc1 = 1.0f - b1;
  hs.bc2 = 1.0f - b2;
  hs.fp16 = g_t == cuda::F16::kFP16;
  hs.exp_avg_bf16 = m_bf16;
  hs.exp_avg_sq_bf16 = v_bf16;
  mt::host_adamw(ww.data(), wm.data(), wv.data(), g.data(), w16h.data(), split, true, hs);
  mt::host_adamw(ww.data() + split, wm.data() + split, wv.data() + split, g.data() + split, w16h.data() + split, n - split, false, hs);
  auto to_bf16_device = [](const Vec& x) {
    auto b = std::make_unique<Buf<uint16_t>>(x.size());
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = mt::float_to_bf16(x[i]);
    MT_CUDA_CHECK(cudaMemcpy(b->p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    return b;
  };
  auto from_bf16_device = [](const Buf<uint16_t>& b) {
    std::vector<uint16_t> h(b.n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(h.data(), b.p, b.n * 2, cudaMemcpyDeviceToHost));
    Vec x(b.n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = mt::bf16_to_float(h[i]);
    return x;
  };
  F32 dw(w), dg(g), dm(m), dv(v), partials(cuda::kNormPartials);
  auto dm16 = to_bf16_device(m), dv16 = to_bf16_device(v);
  B16 w16(w.size());
  Buf<cuda::StepState> st(1);
  MT_CUDA_CHECK(cudaMemset(st.p, 0, sizeof(cuda::StepState)));
  std::vector<cuda::AdamChunk> chunks{{0, static_cast<int32_t>(split), 1}, {split, static_cast<int32_t>(n - split), 0}};
  Buf<cuda::AdamChunk> dc(2);
  MT_CUDA_CHECK(cudaMemcpy(dc.p, chunks.data(), 2 * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  cuda::sumsq_partials(partials.p, dg.p, dc.p, 2, false, nullptr);
  cuda::step_prepare(st.p, partials.p, 1.0f, b1, b2, 1.0f, cuda::LossScaleRule{}, nullptr);
  cuda::adamw_multi({.w = dw.p, .m = m_bf16 ? nullptr : dm.p, .v = v_bf16 ? nullptr : dv.p,
                     .m16 = m_bf16 ? reinterpret_cast<bf16*>(dm16->p) : nullptr, .v16 = v_bf16 ? reinterpret_cast<bf16*>(dv16->p) : nullptr,
                     .w16 = w16.b(), .g = dg.p, .chunks = dc.p, .count = 2, .state = st.p, .lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps,
                     .weight_decay = wd, .type = g_t},
                    nullptr);
  expect(tag + " weights", dw.get(), ww, 1e-6);
  const Vec got_m = m_bf16 ? from_bf16_device(*dm16) : dm.get(), got_v = v_bf16 ? from_bf16_device(*dv16) : dv.get();
  expect(tag + " m", got_m, wm, m_bf16 ? 8e-3 : 1e-6);
  expect(tag + " v", got_v, wv, v_bf16 ? 8e-3 : 1e-6);
  int64_t off = 0, flips = 0;
  for (size_t i = 0; i < got_m.size(); ++i) {
    for (const auto& [x, want, bf] : {std::tuple{got_m[i], wm[i], m_bf16}, std::tuple{got_v[i], wv[i], v_bf16}}) {
      if (!bf) continue;
      off += mt::round_bf16(x) != x;
      flips += x != want;
    }
  }
  const bool ok = off == 0 && flips * 1000 <= n;
  std::printf("%-4s %-48s %lld stored moments off the host's rounding of %lld\n", ok ? "ok" : "FAIL", (tag + " rounding").c_str(),
              static_cast<long long>(flips), static_cast<long long>(2 * n));
  if (!ok) ++failures;
}

// Hidden dropout with the CPU engine's masks: rows [t0, t0 + rows) of a micro batch of samples of S tokens,
// each sample with its own key per site: the standalone kernel (fp32, exact), and fused into the add + norm
// (the dropped-out branch added to the residual) and its backward (the branch's gradient, dres16, masked).
void test_dropout(int64_t rows, int64_t h, int64_t t0, int64_t S) {
  const float p = 0.1f;
  const int32_t stride = 3, site = 1;
  const int64_t B = (t0 + rows + S - 1) / S;
  std::vector<uint64_t> keys(static_cast<size_t>(B * stride));
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = 0x9e3779b97f4a7c15ull * (i + 1);
  Buf<uint64_t> dkeys(keys.size());
  MT_CUDA_CHECK(cudaMemcpy(dkeys.p, keys.data(), keys.size() * 8, cudaMemcpyHostToDevice));
  const cuda::RowDropout drop{p, dkeys.p, stride, site, t0, S};
  auto cpu_drop = [&](Vec v) {  // the CPU engine's dropout, row by row
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t t = t0 + i;
      float* row = v.data() + i * h;
      cpu::dropout_forward(row, row, h, p, keys[static_cast<size_t>((t / S) * stride + site)], static_cast<uint64_t>((t % S) * h));
    }
    return v;
  };
  const std::string tag = "dropout " + std::to_string(rows) + "x" + std::to_string(h);
  Vec x = randn(static_cast<size_t>(rows * h), 1.0f, false);
  F32 dx(x);
  cuda::dropout_rows_f32(dx.p, rows, h, drop, nullptr);
  expect(tag + " (fp32 rows)", dx.get(), cpu_drop(x), 0.0);
  // Fused into the forward: s = x + dropout(delta), fp32 residual.
  Vec delta = randn(x.size()), w = randn(static_cast<size_t>(h)), y(x.size()), rstd(static_cast<size_t>(rows));
  const Vec dd = cpu_drop(delta);
  Vec s(x.size());
  for (size_t i = 0; i < x.size(); ++i) s[i] = x[i] + dd[i];
  F32 dx2(x), dsum(x.size()), drstd(rstd.size());
  B16 ddelta(delta), dw(w), dy(y.size());
  cuda::add_norm_forward({.sum_out = dsum.p, .y = dy.b(), .mean = nullptr, .rstd = drstd.p, .x = dx2.p, .delta = ddelta.b(), .w = dw.b(),
                          .b = nullptr, .rows = rows, .width = h, .eps = 1e-5f, .rms = true, .type = g_t, .res16 = false, .dropout = &drop}, nullptr);
  expect(tag + " fused in add + norm (sum)", dsum.get(), s, 1e-6);
  // Backward: dres accumulates unmasked, dres16 = (dres) * mask.
  cpu::rmsnorm_forward(y.data(), rstd.data(), s.data(), w.data(), rows, h, 1e-5f);
  Vec dout = randn(x.size()), gx(x.size()), gw(w.size(), 0.0f), want(x.size());
  cpu::rmsnorm_backward(gx.data(), gw.data(), dout.data(), s.data(), w.data(), rstd.data(), rows, h);
  F32 dres(Vec(x.size(), 0.0f)), gdw(Vec(w.size(), 0.0f));
  B16 dres16(x.size()), ddout(dout);
  const Vec m0(static_cast<size_t>(rows), 0.0f);
  F32 mz(m0);
  cuda::norm_backward_add({.dres = dres.p, .dres16 = dres16.b(), .dw = gdw.p, .db = nullptr, .dy = ddout.b(), .x = dsum.p, .mean = mz.p,
                           .rstd = drstd.p, .w = dw.b(), .rows = rows, .width = h, .rms = true, .type = g_t, .res16 = false, .dropout = &drop}, nullptr);
  expect(tag + " backward (residual, unmasked)", dres.get(), gx, 2e-3);
  expect(tag + " backward (branch gradient, masked)", dres16.get(), rounded16(cpu_drop(dres.get())), 1e-2);
}

// fp16's dynamic loss scale kept on the device by step_prepare: the same scale after every step as the host
// LossScaler (Megatron's DynamicGradScaler) for a sequence of clean and overflowing steps; overflows with a
// finite loss skip without counting as NaN iterations; the AdamW step reads 1 / the scale that step used.
void test_device_loss_scaler() {
  mt::Config c;
  c.precision.fp16 = true;
  c.precision.initial_loss_scale = 1024;
  c.precision.loss_scale_window = 3;
  c.precision.hysteresis = 2;
  c.precision.min_loss_scale = 64;
  mt::LossScaler host(c);
  cuda::LossScaleRule rule;
  rule.fp16 = rule.dynamic = true;
  rule.min_scale = 64;
  rule.window = 3;
  rule.hysteresis = 2;
  Buf<cuda::StepState> st(1);
  cuda::StepState init{};
  init.loss_scale = host.scale();
  init.hysteresis_left = 2;
  MT_CUDA_CHECK(cudaMemcpy(st.p, &init, sizeof(init), cudaMemcpyHostToDevice));
  F32 partials(cuda::kNormPartials);
  const bool overflow[] = {true, true, true, false, false, false, true, false, false, false, false, false, false, true, true, true, true, true};
  bool same = true;
  int skipped = 0;
  std::string trace;
  for (bool o : overflow) {
    std::vector<float> part(cuda::kNormPartials, 0.0f);
    part[0] = o ? INFINITY : 4.0f * host.scale() * host.scale();  // a gradient norm of 2, scaled
    MT_CUDA_CHECK(cudaMemcpy(partials.p, part.data(), part.size() * 4, cudaMemcpyHostToDevice));
    const float used = host.scale();
    cuda::step_prepare(st.p, partials.p, 0.0f, 0.9f, 0.95f, 1.0f, rule, nullptr);
    host.update(o);
    skipped += o ? 1 : 0;
    cuda::StepState h{};
    MT_CUDA_CHECK(cudaMemcpy(&h, st.p, sizeof(h), cudaMemcpyDeviceToHost));
    char num[24];
    std::snprintf(num, sizeof(num), " %g", static_cast<double>(h.loss_scale));
    trace.append(num);
    same = same && h.loss_scale == host.scale() && h.skip == (o ? 1 : 0) && h.unscale == 1.0f / used && (o || h.grad_norm == 2.0f);
    same = same && h.skipped_total == skipped && h.nan_total == 0 && h.max_nonfinite_run == 0;
  }
  std::printf("%-4s device loss scaler = host LossScaler over 18 steps, scales:%s\n", same ? "ok" : "FAIL", trace.c_str());
  if (!same) ++failures;
}

// The MoE layer's data movement (in bf16 and in fp16, as the run's type): the permutation of T x k choices into expert-major
// rows (each expert's in token order; several chunks of the permutation, a chunk's choices spread over its warps),
// the gather, the weighted combine and its backward, and the input gradient (the rows' sum and the router's term),
// against plain loops. `skew`: most tokens put expert 0 first (an uneven split, as a router early in training makes).
// h % 8 != 0 takes the one-column kernels.
// `drops`: then about a fifth of the choices dropped (row -1, as a capacity factor drops them) for the kernels after
// the permutation: no row gathered or combined, no gradient.
void test_moe_dispatch(int64_t T, int64_t E, int64_t k, int64_t h, bool skew, bool drops = false) {
  const std::string name = "moe dispatch T " + std::to_string(T) + " E " + std::to_string(E) + " k " + std::to_string(k) + " h " + std::to_string(h) +
                           (skew ? " skewed" : "") + (drops ? " drops" : "");
  std::vector<int32_t> top(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token
    std::vector<int32_t> e(static_cast<size_t>(E));
    for (int64_t x = 0; x < E; ++x) e[static_cast<size_t>(x)] = static_cast<int32_t>(x);
    std::shuffle(e.begin(), e.end(), rng);
    if (skew && rng() % 4 != 0) std::swap(e[0], *std::find(e.begin(), e.end(), 0));
    for (int64_t j = 0; j < k; ++j) top[static_cast<size_t>(t * k + j)] = e[static_cast<size_t>(j)];
  }
  // The reference permutation: expert-major, token order within each expert.
  std::vector<int32_t> counts(static_cast<size_t>(E)), offsets(static_cast<size_t>(E + 1)), row(top.size());
  for (int32_t e : top) ++counts[static_cast<size_t>(e)];
  for (int64_t e = 0; e < E; ++e) offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + counts[static_cast<size_t>(e)];
  std::vector<int32_t> at(offsets.begin(), offsets.end() - 1);
  for (size_t i = 0; i < top.size(); ++i) row[i] = at[static_cast<size_t>(top[i])]++;
  const cuda::MoeRouting r{T, E, k, h};
  auto idev = [](const std::vector<int32_t>& v) {
    int32_t* d = nullptr;
    MT_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * 4));
    MT_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  auto iget = [](const int32_t* d, size_t n) {
    std::vector<int32_t> v(n);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    MT_CUDA_CHECK(cudaMemcpy(v.data(), d, n * 4, cudaMemcpyDeviceToHost));
    return v;
  };
  int32_t* d_top = idev(top);
  int32_t* d_row = idev(std::vector<int32_t>(top.size(), -7));
  int32_t* d_counts = idev(std::vector<int32_t>(counts.size(), -7));
  int32_t* d_offsets = idev(std::vector<int32_t>(offsets.size(), -7));
  int32_t* d_parts = idev(std::vector<int32_t>(static_cast<size_t>(cuda::moe_permute_scratch(r)), -7));
  cuda::moe_permute(d_row, d_counts, d_offsets, d_parts, d_top, r, nullptr);
  const bool perm_ok = iget(d_row, row.size()) == row && iget(d_counts, counts.size()) == counts && iget(d_offsets, offsets.size()) == offsets;
  std::printf("%-4s %-48s the rows, counts and offsets %s\n", perm_ok ? "ok" : "FAIL", (name + " permute").c_str(), perm_ok ? "equal" : "differ");
  if (!perm_ok) ++failures;
  if (drops) {  // the kept choices' rows renumbered, expert-major in token order
    std::vector<int32_t> kept(static_cast<size_t>(E), 0), next(static_cast<size_t>(E), 0);
    std::vector<bool> keep(top.size());
    for (size_t i = 0; i < top.size(); ++i) {
      keep[i] = rng() % 5 != 0;
      if (keep[i]) ++kept[static_cast<size_t>(top[i])];
    }
    for (int64_t e = 1; e < E; ++e) next[static_cast<size_t>(e)] = next[static_cast<size_t>(e - 1)] + kept[static_cast<size_t>(e - 1)];
    for (size_t i = 0; i < top.size(); ++i) row[i] = keep[i] ? next[static_cast<size_t>(top[i])]++ : -1;
    MT_CUDA_CHECK(cudaMemcpy(d_row, row.data(), row.size() * 4, cudaMemcpyHostToDevice));
  }
  // Gather, combine, combine backward, input backward, against loops over the same bf16 inputs.
  const size_t Tk = top.size(), H = static_cast<size_t>(h), TH = static_cast<size_t>(T) * H;
  const Vec xn = randn(TH), y = randn(Tk * H), dout = randn(TH), w = randn(static_cast<size_t>(E) * H, 0.1f);
  Vec weight(Tk), dlogits(static_cast<size_t>(T * E));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : weight) x = u(rng);
  for (auto& x : dlogits) x = u(rng) - 0.5f;
  B16 d_xn(xn), d_y(y), d_dout(dout), d_w(w), d_rows(Tk * H), d_out(TH), d_dy_rows(Tk * H), d_dxn(TH);
  F32 d_weight(weight), d_dlogits(dlogits), d_dweight(Tk);
  cuda::moe_gather(d_rows.b(), d_xn.b(), d_row, r, nullptr, g_t);
  cuda::moe_combine(d_out.b(), d_y.b(), d_row, d_weight.p, r, nullptr, g_t);
  cuda::moe_combine_backward(d_dy_rows.b(), d_dweight.p, d_dout.b(), d_y.b(), d_row, d_weight.p, r, nullptr, g_t);
  cuda::moe_input_backward(d_dxn.b(), d_y.b(), d_row, d_dlogits.p, d_w.b(), r, nullptr, g_t);  // (y standing in for the rows' gradients)
  Vec rows(Tk * H), out(TH), dy_rows(Tk * H), dweight(Tk), dxn(TH);
  for (int64_t t = 0; t < T; ++t) {
    const size_t at_t = static_cast<size_t>(t) * H;
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t * k + j);
      if (row[i] < 0) continue;  // dropped: no row, dweight 0
      const size_t rr = static_cast<size_t>(row[i]) * H;
      double dot = 0;
      for (size_t c = 0; c < H; ++c) {
        rows[rr + c] = xn[at_t + c];
        out[at_t + c] += weight[i] * y[rr + c];
        dy_rows[rr + c] = round16(weight[i] * dout[at_t + c]);
        dot += static_cast<double>(y[rr + c]) * dout[at_t + c];
        dxn[at_t + c] += y[rr + c];
      }
      dweight[i] = static_cast<float>(dot);
    }
    for (int64_t e = 0; e < E; ++e) {
      for (size_t c = 0; c < H; ++c) dxn[at_t + c] += dlogits[static_cast<size_t>(t * E + e)] * w[static_cast<size_t>(e) * H + c];
    }
  }
  // (the rows in use: every choice's, or the kept ones')
  const auto used = static_cast<size_t>(std::count_if(row.begin(), row.end(), [](int32_t r) { return r >= 0; })) * H;
  const auto head = [used](Vec v) {
    v.resize(used);
    return v;
  };
  expect(name + " gather", head(d_rows.get()), head(rows), 0.0);
  expect(name + " combine", d_out.get(), out, 8e-3);
  expect(name + " combine backward rows", head(d_dy_rows.get()), head(dy_rows), 0.0);
  expect(name + " combine backward weights", d_dweight.get(), dweight, 1e-5);
  expect(name + " input backward", d_dxn.get(), dxn, 8e-3);
  // The router: its logits by the kernel and by the engine's cuBLASLt GEMM (16-bit inputs, fp32 output), against fp64 dots;
  // its weight gradient dw += dlogits^T xn in the kernel's order (64 parts of the tokens, each summed in order by fused
  // multiply-adds, then the parts in order): bit for bit.
  Vec logits(static_cast<size_t>(T * E)), dw0 = randn(static_cast<size_t>(E) * H, 0.1f, false), dw = dw0;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double dot = 0;
      for (size_t c = 0; c < H; ++c) dot += static_cast<double>(xn[static_cast<size_t>(t) * H + c]) * w[static_cast<size_t>(e) * H + c];
      logits[static_cast<size_t>(t * E + e)] = static_cast<float>(dot);
    }
  }
  F32 d_logits(logits.size()), d_dw(dw0), d_wparts(static_cast<size_t>(cuda::moe_router_wgrad_scratch(r)));
  cuda::moe_router_logits(d_logits.p, d_xn.b(), d_w.b(), r, nullptr, g_t);
  expect(name + " router logits (kernel)", d_logits.get(), logits, 1e-5);
  auto& lt = cuda::GemmLt::instance();
  if (lt.has_algorithm(false, true, T, E, h, h, h, E, g_ab(), CUDA_R_32F, {})) {
    lt.gemm_ex(false, true, T, E, h, 1.0f, d_xn.b(), h, d_w.b(), h, 0.0f, d_logits.p, E, g_ab(), CUDA_R_32F, nullptr, nullptr);
    expect(name + " router logits (GEMM)", d_logits.get(), logits, 1e-5);
  }
  cuda::moe_router_wgrad(d_dw.p, d_wparts.p, d_dlogits.p, d_xn.b(), r, nullptr, g_t);
  const int64_t parts = 64, per = (T + parts - 1) / parts;
  for (int64_t e = 0; e < E; ++e) {
    for (size_t c = 0; c < H; ++c) {
      float sum = 0.0f;
      for (int64_t p = 0; p < parts; ++p) {
        float part = 0.0f;
        for (int64_t t = p * per; t < std::min(T, (p + 1) * per); ++t) {
          part = std::fma(dlogits[static_cast<size_t>(t * E + e)], xn[static_cast<size_t>(t) * H + c], part);
        }
        sum += part;
      }
      dw[static_cast<size_t>(e) * H + c] += sum;
    }
  }
  expect(name + " router weight gradient", d_dw.get(), dw, 0.0);
  for (int32_t* d : {d_top, d_row, d_counts, d_offsets, d_parts}) cudaFree(d);
}

// --moe-router-force-load-balancing: the kernel's random logits against the host's function (model/moe_random_logits.h,
// the CPU engine's) for every row and expert, with a first sample and layer other than 0 (within an ulp of logf / cosf).
void test_moe_random_logits() {
  const int64_t S = 48, B = 3, E = 16, first_sample = 1234, layer = 5;
  const uint64_t key = mt::moe_random_logits_key(7);
  const cuda::MoeRouting r{B * S, E, 2, 16};
  F32 d_logits(Vec(static_cast<size_t>(B * S * E), 0.0f));
  cuda::moe_random_logits(d_logits.p, r, key, layer, first_sample, S, nullptr);
  Vec want(static_cast<size_t>(B * S * E));
  for (int64_t t = 0; t < B * S; ++t) {
    for (int64_t e = 0; e < E; ++e) want[static_cast<size_t>(t * E + e)] = mt::moe_random_logit(key, layer, first_sample + t / S, t % S, S, E, e);
  }
  expect("moe random logits (--moe-router-force-load-balancing) against the host's", d_logits.get(), want, 1e-5);
}

// Sinkhorn routing (--moe-router-load-balancing-type sinkhorn): the one-block kernel against the host's normalisation
// (the same updates and stopping rule in fp32; the sums over tokens in another order), and the top-2 choice it makes
// through moe_route's choice scores against the host's route_topk (up to a near tie).
void test_moe_sinkhorn(int64_t T, int64_t E) {
  const cuda::MoeRouting r{T, E, 2, 16, false, true};
  Vec logits = randn(static_cast<size_t>(T * E), 1.0f, false);
  for (int64_t t = 0; t < T; ++t) logits[static_cast<size_t>(t * E)] += 1.5f;  // (an expert every token prefers)
  F32 d_logits(logits), d_out(static_cast<size_t>(T * E)), d_scratch(static_cast<size_t>(T * (E + 1)));
  cuda::moe_sinkhorn(d_out.p, d_scratch.p, d_logits.p, r, nullptr);
  const Vec want = mt::cpu::sinkhorn_normalize(logits.data(), T, E);
  const Vec got = d_out.get();
  expect("moe sinkhorn T" + std::to_string(T) + " E" + std::to_string(E) + " against the host's", got, want, 1e-3);
  Buf<int32_t> d_top(static_cast<size_t>(T * 2));
  F32 d_weight(static_cast<size_t>(T * 2));
  cuda::moe_route(d_top.p, d_weight.p, d_logits.p, r, nullptr, nullptr, d_out.p);
  std::vector<int32_t> top(static_cast<size_t>(T * 2)), host_top(top.size());
  MT_CUDA_CHECK(cudaMemcpy(top.data(), d_top.p, top.size() * 4, cudaMemcpyDeviceToHost));
  Vec host_weight(top.size());
  mt::cpu::RouterSettings rs{E, 2, mt::cpu::ScoreFunction::kSoftmax, true, 1.0f, 0, 0};
  mt::cpu::route_topk(rs, logits.data(), nullptr, T, host_top.data(), host_weight.data(), want.data());
  int64_t differ = 0;
  for (size_t i = 0; i < top.size(); ++i) differ += top[i] != host_top[i];
  const bool choice_ok = differ <= T / 100;
  std::printf("%-4s moe sinkhorn's top-2 choice: %lld of %lld differ from the host's\n", choice_ok ? "ok" : "FAIL", static_cast<long long>(differ),
              static_cast<long long>(T * 2));
  if (!choice_ok) ++failures;
  // The weights where the choices agree (a near tie may swap one): the softmax over all experts at the chosen ones.
  Vec weight = d_weight.get(), agreeing, host_agreeing;
  for (size_t i = 0; i < top.size(); ++i) {
    if (top[i] != host_top[i]) continue;
    agreeing.push_back(weight[i]);
    host_agreeing.push_back(host_weight[i]);
  }
  expect("moe sinkhorn's routing weights (the softmax over all experts)", agreeing, host_agreeing, 1e-5);
}

// fp16: the router's backward takes the aux and z terms times the device-side loss scale, as the lm loss's gradient
// (the routing weights' part) carries it. With no routing-weight gradient, the scale 1024 (a power of two) must give
// exactly 1024 times the unscaled gradient; with the routing weights' gradient alone, exactly the unscaled one (it has
// the scale already: scaling it again would be wrong).
void test_moe_router_loss_scale() {
  const int64_t T = 64, E = 8, k = 2;
  const cuda::MoeRouting r{T, E, k, 16};
  Vec logits = randn(static_cast<size_t>(T * E), 1.0f, false), dscale(static_cast<size_t>(E));
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& x : dscale) x = u(rng);
  std::vector<int32_t> top(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    top[static_cast<size_t>(t * k)] = static_cast<int32_t>(t % E);
    top[static_cast<size_t>(t * k + 1)] = static_cast<int32_t>((t + 3) % E);
  }
  int32_t* d_top = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&d_top, top.size() * 4));
  MT_CUDA_CHECK(cudaMemcpy(d_top, top.data(), top.size() * 4, cudaMemcpyHostToDevice));
  F32 d_logits(logits), d_dscale(dscale), d_dweight(Vec(static_cast<size_t>(T * k), 0.0f)), d_scale(Vec{1024.0f}), plain(logits.size()),
      scaled(logits.size());
  cuda::moe_router_backward(plain.p, d_logits.p, d_top, d_dweight.p, d_dscale.p, 1e-2f, 0.37f, r, nullptr);
  cuda::moe_router_backward(scaled.p, d_logits.p, d_top, d_dweight.p, d_dscale.p, 1e-2f, 0.37f, r, nullptr, d_scale.p);
  Vec want = plain.get();
  double norm = 0;
  for (float& x : want) {
    norm += std::fabs(x);
    x *= 1024.0f;
  }
  expect("moe router backward under fp16's loss scale", scaled.get(), want, 0.0);
  Vec dweight(static_cast<size_t>(T * k));
  for (auto& x : dweight) x = u(rng) - 0.5f;
  F32 d_routing(dweight);
  cuda::moe_router_backward(plain.p, d_logits.p, d_top, d_routing.p, nullptr, 0.0f, 0.37f, r, nullptr);
  cuda::moe_router_backward(scaled.p, d_logits.p, d_top, d_routing.p, nullptr, 0.0f, 0.37f, r, nullptr, d_scale.p);
  const Vec routing = plain.get();
  double routing_norm = 0;
  for (float x : routing) routing_norm += std::fabs(x);
  expect("moe router backward: the routing weights' part unscaled", scaled.get(), routing, 0.0);
  if (norm == 0 || routing_norm == 0) {
    std::printf("FAIL moe router backward: the aux and z terms or the routing weights' gave no gradient\n");
    ++failures;
  }
  cudaFree(d_top);
}

// --moe-pad-expert-input-to-capacity's padding rows: rows[map row] = xn[map token] (the forward), then zeros there (their
// output gradients); every other row untouched.
void test_moe_pad_rows(int64_t rows_n, int64_t T, int64_t pads, int64_t h) {
  const std::string name = "moe pad rows " + std::to_string(pads) + " of " + std::to_string(rows_n) + " h " + std::to_string(h);
  std::vector<int32_t> which(static_cast<size_t>(rows_n));
  for (int64_t i = 0; i < rows_n; ++i) which[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(which.begin(), which.end(), rng);
  std::vector<int32_t> map(static_cast<size_t>(2 * pads));
  for (int64_t i = 0; i < pads; ++i) {
    map[static_cast<size_t>(2 * i)] = which[static_cast<size_t>(i)];
    map[static_cast<size_t>(2 * i + 1)] = static_cast<int32_t>(rng() % static_cast<uint64_t>(T));
  }
  const auto H = static_cast<size_t>(h);
  const Vec xn = randn(static_cast<size_t>(T) * H), before = randn(static_cast<size_t>(rows_n) * H);
  B16 d_xn(xn), d_rows(before);
  int32_t* d_map = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&d_map, std::max<size_t>(1, map.size()) * 4));
  MT_CUDA_CHECK(cudaMemcpy(d_map, map.data(), map.size() * 4, cudaMemcpyHostToDevice));
  Vec want = rounded16(before);
  cuda::moe_pad_rows(d_rows.b(), d_xn.b(), d_map, pads, h, nullptr, g_t);
  for (int64_t i = 0; i < pads; ++i) {
    const size_t r = static_cast<size_t>(map[static_cast<size_t>(2 * i)]) * H, t = static_cast<size_t>(map[static_cast<size_t>(2 * i + 1)]) * H;
    for (size_t c = 0; c < H; ++c) want[r + c] = round16(xn[t + c]);
  }
  expect(name + " copied", d_rows.get(), want, 0.0);
  cuda::moe_pad_rows(d_rows.b(), nullptr, d_map, pads, h, nullptr, g_t);
  for (int64_t i = 0; i < pads; ++i) {
    const size_t r = static_cast<size_t>(map[static_cast<size_t>(2 * i)]) * H;
    for (size_t c = 0; c < H; ++c) want[r + c] = 0.0f;
  }
  expect(name + " zeroed", d_rows.get(), want, 0.0);
  cudaFree(d_map);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no GPU visible: the CUDA engine's op tests run on the GPU machine (scripts/test_gpu.sh)\n");
    return 77;
  }
  for (cuda::F16 t : {cuda::F16::kBF16, cuda::F16::kFP16}) {
    g_t = t;
    test_mla_heads(37, 4, 32, 16, 24);
    test_mla_heads(64, 16, 128, 64, 128);  // (DeepSeek-V3's widths)
    test_mla_heads(5, 3, 12, 4, 20);       // (widths no multiple of 8: the scalar kernels)
    for (bool rms : {false, true}) {
      test_norm(7, 5, rms);
      test_norm(37, 1000, rms);
      test_norm(64, 2048, rms);
      test_norm(9, 8192, rms);
      test_norm(13, 1004, rms);  // h not a multiple of 8: the scalar path
      test_norm(11, 1600, rms, true);
      test_norm(37, 1000, rms, true);
      test_norm(9, 8192, rms, true);
      test_norm(5, 4096, rms, true);  // two runs of 8 per thread
      test_norm(5, 6144, rms);        // three runs, in the four-run kernel
      test_norm(3000, 768, rms);      // more rows than resident blocks: each block's weight-gradient sums cover several rows
      test_norm(2500, 2048, rms, true);
      test_norm_partials(16, 2048, rms, true, 2, 8);
      test_norm_partials(9, 1000, rms, false, 3, 8);
      test_norm_partials(9, 1004, rms, true, 4, 5);  // h not a multiple of 8: the scalar kernels
    }
    test_qkv(13, 6, 2, 16, 16, true);  // vectorised path
    test_qkv(13, 6, 3, 16, 8, true);   // partial rotary: scalar path
    test_qkv(9, 4, 4, 24, 24, false);  // d not a multiple of 16: scalar path
    test_qkv(11, 4, 1, 64, 64, true);
    test_qkv(13, 6, 2, 16, 16, true, true);  // --rotary-interleaved (never the vectorised path)
    test_qkv(13, 6, 3, 16, 8, true, true);
    test_activations(3, 5);
    test_activations(37, 264);
    test_cross_entropy(17, 1003);
    test_cross_entropy(9, 50304);
    test_cross_entropy_sharded(17, 1006, 2);
    test_cross_entropy_sharded(9, 50304, 4);
    cuda::GemmLt::instance().set_autotune(false);  // (cuBLASLt's first heuristic algorithm, as MEGATRAIN_GEMM_AUTOTUNE=0)
    test_gemm_gelu(333, 64, 264, 40);
    test_gemm_gelu(1024, 768, 3072, 768);
    // the same GEMMs with their algorithm timed among cuBLASLt's candidates (shapes of their own: new plans, tuned)
    cuda::GemmLt::instance().set_autotune(true);
    test_gemm_gelu(1040, 768, 3072, 768);
    test_gemm_gelu(336, 64, 264, 40);
    test_gemm_varying(264, 128);
    test_wgrad_bias_epilogue(333, 264, 40);
    test_wgrad_bias_epilogue(4096, 2304, 768);
    test_bias_grad(301, 7);
    test_bias_grad(1000, 264);
    test_embedding(333, 40, 97, 50);
    test_adamw(100000, 50000);  // both chunks on 16-byte boundaries
    test_adamw(100003, 50001);  // neither
    test_adamw(100003, 50000);  // one of each in the same launch
    for (const auto& [m_bf16, v_bf16] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
      test_adamw_bf16_moments(100000, 50000, m_bf16, v_bf16);
      test_adamw_bf16_moments(100003, 50001, m_bf16, v_bf16);
    }
  }
  test_device_loss_scaler();
  test_moe_router_loss_scale();
  test_moe_random_logits();
  test_moe_sinkhorn(512, 8);
  test_moe_sinkhorn(4096, 64);
  for (cuda::F16 t : {cuda::F16::kBF16, cuda::F16::kFP16}) {
    g_t = t;
    test_moe_dispatch(1000, 8, 2, 2048, false);  // 8 chunks of the permutation, the last one partial
    test_moe_dispatch(1000, 8, 2, 264, true);
    test_moe_dispatch(333, 64, 6, 100, false);  // h % 8 != 0: the one-column kernels
    test_moe_dispatch(300, 256, 8, 136, true);  // the most experts
    test_moe_dispatch(5, 4, 1, 40, false);      // under one chunk, under one input-gradient block of tokens
    test_moe_dispatch(1000, 8, 2, 2048, true, true);  // choices dropped by a capacity
    test_moe_dispatch(333, 64, 6, 100, false, true);
    test_moe_pad_rows(600, 300, 250, 2048);
    test_moe_pad_rows(90, 40, 33, 100);  // h % 8 != 0: one column a thread
    test_moe_pad_rows(8, 4, 0, 64);      // nothing to pad
  }
  for (cuda::F16 t : {cuda::F16::kBF16, cuda::F16::kFP16}) {
    g_t = t;
    test_dropout(13, 40, 5, 9);    // rows spanning two samples; the vectorised norms (one warp per row)
    test_dropout(7, 1000, 11, 4);  // vectorised, four samples
    test_dropout(5, 1004, 0, 2);   // the scalar norms (1004 is not a multiple of 8)
  }
  std::printf("%d failure(s)\n", failures);
  return failures ? 1 : 0;
}
