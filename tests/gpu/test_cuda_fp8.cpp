// test_cuda_fp8.cpp: the CUDA engine's FP8 pieces against the CPU emulation (kernels/cpu/fp8) on the GPU machine:
// the amax and the cast (row-major and transposed, E4M3 and E5M2, tiles cut at the edges) byte for byte; the
// FP8 GEMM (cuBLASLt, "TN", device scales, fp32 and bf16 outputs, bias, fast and precise accumulation) bit for
// bit on operands whose sums are exact in fp32; a linear layer's forward in FP8 on random data within fp32
// summation order; delayed scaling's cast (the scale given, the amax gathered in the same pass, saturating what
// the scale pushes past the format) and its update kernel against model/fp8_scaling.h's rule on the host, bit
// for bit; SwiGLU and its backward fused with that cast against the two kernels apart (the activation kernel, then
// the cast), byte for byte. Exit 77 (skipped) where no GPU is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_swiglu.h"
#include "kernels/cuda/gemm_lt.h"
#include "model/fp8_scaling.h"
#include "tensor/device_info.h"
#include "tensor/dtype.h"
#include "tensor/rng.h"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++failures;
}
using mt::test::download;
using mt::test::upload;
mt::cpu::Fp8Format cpu_format(mt::cuda::Fp8Type t) { return t == mt::cuda::Fp8Type::kE5M2 ? mt::cpu::Fp8Format::kE5M2 : mt::cpu::Fp8Format::kE4M3; }

// bf16 values of several magnitudes (some tiny: the subnormals and zero of the formats), with exact ties.
std::vector<uint16_t> test_values(size_t n, uint64_t key, float spread) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>(i % 23) - 14) * spread;
    v[i] = mt::float_to_bf16(mag * mt::philox_normal(key, i));
  }
  v[n / 2] = mt::float_to_bf16(-3.5f * spread);  // an exact negative value
  v[1] = 0;
  return v;
}

void test_cast(mt::cuda::Fp8Type type, int64_t rows, int64_t cols, float spread) {
  const size_t n = static_cast<size_t>(rows * cols);
  const std::vector<uint16_t> x = spread > 0 ? test_values(n, 7, spread) : std::vector<uint16_t>(n, 0);
  std::vector<float> xf(n);
  for (size_t i = 0; i < n; ++i) xf[i] = mt::bf16_to_float(x[i]);
  auto* dx = upload(x);
  auto* amax = upload(std::vector<float>(2, -1.0f));
  auto* out = upload(std::vector<uint8_t>(n));
  auto* out_t = upload(std::vector<uint8_t>(n));
  const auto* bx = reinterpret_cast<const mt::cuda::bf16*>(dx);
  mt::cuda::fp8_amax(bx, static_cast<int64_t>(n), amax, nullptr);
  mt::cuda::fp8_cast(bx, rows, cols, amax, type, out, out_t, amax + 1, nullptr);
  cudaDeviceSynchronize();
  const auto a = download(amax, 2);
  const auto q = download(out, n), qt = download(out_t, n);
  const float cpu_amax = mt::cpu::abs_max(xf.data(), static_cast<int64_t>(n));
  const float scale = mt::cpu::fp8_scale_from_amax(cpu_amax, cpu_format(type));
  size_t bad = 0, bad_t = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t want = mt::cpu::fp8_encode(xf[static_cast<size_t>(r * cols + c)] * scale, cpu_format(type));
      bad += q[static_cast<size_t>(r * cols + c)] != want;
      bad_t += qt[static_cast<size_t>(c * rows + r)] != want;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "fp8 cast %s %lldx%lld%s: amax %g (CPU %g), scale_inv %g (CPU %g), %zu + %zu bytes differ", type == mt::cuda::Fp8Type::kE5M2 ? "E5M2" : "E4M3",
                static_cast<long long>(rows), static_cast<long long>(cols), spread > 0 ? "" : " (zeros)", a[0], cpu_amax, a[1], 1.0f / scale, bad, bad_t);
  check(a[0] == cpu_amax && a[1] == 1.0f / scale && bad == 0 && bad_t == 0, buf);
  cudaFree(dx);
  cudaFree(amax);
  cudaFree(out);
  cudaFree(out_t);
}

// Delayed scaling's cast: the scale given (here one that saturates the largest values), the amax added to an
// accumulator already holding `prior`; bytes, transposes, amax and inverse scale as the CPU computes them.
void test_cast_scaled(mt::cuda::Fp8Type type, int64_t rows, int64_t cols, float spread, float scale, float prior) {
  const size_t n = static_cast<size_t>(rows * cols);
  const std::vector<uint16_t> x = test_values(n, 9, spread);
  std::vector<float> xf(n);
  for (size_t i = 0; i < n; ++i) xf[i] = mt::bf16_to_float(x[i]);
  auto* dx = upload(x);
  auto* scalars = upload(std::vector<float>{scale, prior, -1.0f});
  auto* out = upload(std::vector<uint8_t>(n));
  auto* out_t = upload(std::vector<uint8_t>(n));
  mt::cuda::fp8_cast_scaled(reinterpret_cast<const mt::cuda::bf16*>(dx), rows, cols, scalars, scalars + 1, type, out, out_t, scalars + 2, nullptr);
  cudaDeviceSynchronize();
  const auto a = download(scalars, 3);
  const auto q = download(out, n), qt = download(out_t, n);
  const float want_amax = std::fmax(prior, mt::cpu::abs_max(xf.data(), static_cast<int64_t>(n)));
  size_t bad = 0, bad_t = 0, saturated = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = xf[static_cast<size_t>(r * cols + c)] * scale;
      const uint8_t want = mt::cpu::fp8_encode(v, cpu_format(type));
      saturated += std::fabs(v) > mt::cpu::fp8_max(cpu_format(type));
      bad += q[static_cast<size_t>(r * cols + c)] != want;
      bad_t += qt[static_cast<size_t>(c * rows + r)] != want;
    }
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "fp8 cast with a given scale %s %lldx%lld: amax %g (CPU %g), scale_inv %g, %zu saturated, %zu + %zu bytes differ",
                type == mt::cuda::Fp8Type::kE5M2 ? "E5M2" : "E4M3", static_cast<long long>(rows), static_cast<long long>(cols), a[1], want_amax, a[2],
                saturated, bad, bad_t);
  check(a[1] == want_amax && a[2] == 1.0f / scale && bad == 0 && bad_t == 0, buf);
  cudaFree(dx);
  cudaFree(scalars);
  cudaFree(out);
  cudaFree(out_t);
}

// SwiGLU (forward: y [rows, F]; backward: dx [rows, 2F]) fused with delayed scaling's cast against the activation
// kernel and fp8_cast_scaled apart: the same FP8 bytes (row-major and transposed), amax and inverse scale, and the
// forward's optional 16-bit output equal to the activation kernel's. Tiles cut at the edges where rows or F are
// not multiples of 64.
void test_fused_swiglu(mt::cuda::Fp8Type type, bool backward, int64_t rows, int64_t F, float scale) {
  namespace cu = mt::cuda;
  const int64_t out_cols = backward ? 2 * F : F;
  const size_t n_x = static_cast<size_t>(rows * 2 * F), n_y = static_cast<size_t>(rows * F), n_out = static_cast<size_t>(rows * out_cols);
  auto* x = upload(test_values(n_x, 11, 2.0f));
  auto* dy = upload(test_values(n_y, 13, 1.0f));
  auto* y16 = upload(std::vector<uint16_t>(n_out));
  auto* y16_fused = upload(std::vector<uint16_t>(n_y, 0xFFFF));
  auto* scalars = upload(std::vector<float>{scale, 1e-6f, 1e-6f, -1.0f, -1.0f});  // scale, the two accumulators, the two inverses
  std::vector<uint8_t*> bytes(4);
  for (auto& b : bytes) b = upload(std::vector<uint8_t>(n_out, 0xAA));
  const auto* bx = reinterpret_cast<const cu::bf16*>(x);
  const auto* bdy = reinterpret_cast<const cu::bf16*>(dy);
  auto* b16 = reinterpret_cast<cu::bf16*>(y16);
  if (backward) cu::swiglu_backward_bf16(b16, bdy, bx, rows, F, nullptr);
  else cu::swiglu_forward_bf16(b16, bx, rows, F, nullptr);
  cu::fp8_cast_scaled(b16, rows, out_cols, scalars, scalars + 1, type, bytes[0], bytes[1], scalars + 3, nullptr);
  const cu::Fp8CastTarget t{.scale = scalars, .amax_accumulator = scalars + 2, .type = type, .out = bytes[2], .out_t = bytes[3], .scale_inv = scalars + 4};
  const bool launched = backward ? cu::fp8_swiglu_backward_cast(bdy, bx, rows, F, t, nullptr)
                                 : cu::fp8_swiglu_forward_cast(bx, rows, F, t, reinterpret_cast<cu::bf16*>(y16_fused), nullptr);
  cudaDeviceSynchronize();
  const auto a = download(scalars, 5);
  const auto q = download(bytes[0], n_out), qt = download(bytes[1], n_out), fq = download(bytes[2], n_out), fqt = download(bytes[3], n_out);
  size_t bad = 0, bad_t = 0, bad16 = 0;
  for (size_t i = 0; i < n_out; ++i) {
    bad += q[i] != fq[i];
    bad_t += qt[i] != fqt[i];
  }
  if (!backward) {
    const auto want16 = download(y16, n_y), got16 = download(y16_fused, n_y);
    for (size_t i = 0; i < n_y; ++i) bad16 += want16[i] != got16[i];
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "SwiGLU %s fused with the %s cast, %lldx%lld: amax %g (apart %g), scale_inv %g (%g), %zu + %zu bytes and %zu 16-bit values differ",
                backward ? "backward" : "forward", type == cu::Fp8Type::kE5M2 ? "E5M2" : "E4M3", static_cast<long long>(rows),
                static_cast<long long>(F), a[2], a[1], a[4], a[3], bad, bad_t, bad16);
  check(launched && a[1] == a[2] && a[1] > 1e-6f && a[3] == a[4] && bad == 0 && bad_t == 0 && bad16 == 0, buf);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(dy), static_cast<void*>(y16), static_cast<void*>(y16_fused), static_cast<void*>(scalars)}) {
    cudaFree(p);
  }
  for (auto* b : bytes) cudaFree(b);
}

// Blockwise quantisation on the GPU against kernels/cpu/fp8's fp8_quantize_blocks: every byte times its block's
// inverse scale (in cuBLASLt's layouts, kernels/cuda/fp8_block.h) must be the CPU's dequantised value, bit for bit.
std::vector<float> block_values(const std::vector<uint8_t>& q, const std::vector<float>& inv, int64_t rows, int64_t cols, int64_t block_rows,
                                int64_t block_cols, mt::cpu::Fp8Format f) {
  const auto pad4 = [](int64_t n) { return (n + 3) / 4 * 4; };
  const int64_t kb = (cols + 127) / 128;
  std::vector<float> v(q.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      const size_t s = block_rows == 1 ? static_cast<size_t>((c / 128) * pad4(rows) + r)  // 1 x 128 blocks along rows
                                       : static_cast<size_t>((r / 128) * pad4(kb) + c / 128);  // 128 x 128
      v[i] = mt::cpu::fp8_decode(q[i], f) * inv[s];
    }
  }
  (void)block_cols;
  return v;
}

void test_block_quantize(mt::cuda::Fp8Type type, int64_t rows, int64_t cols) {
  namespace cu = mt::cuda;
  const auto f = cpu_format(type);
  const size_t n = static_cast<size_t>(rows * cols);
  const std::vector<uint16_t> x = test_values(n, 17, 3.0f);
  std::vector<float> xf(n), xt(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      xf[static_cast<size_t>(r * cols + c)] = mt::bf16_to_float(x[static_cast<size_t>(r * cols + c)]);
      xt[static_cast<size_t>(c * rows + r)] = xf[static_cast<size_t>(r * cols + c)];
    }
  }
  auto* dx = upload(x);
  const auto* bx = reinterpret_cast<const cu::bf16*>(dx);
  std::vector<uint8_t*> q(4);
  for (auto& b : q) b = upload(std::vector<uint8_t>(n, 0xAA));
  const size_t n_row = static_cast<size_t>(cu::fp8_vec128_scales(rows, cols)), n_col = static_cast<size_t>(cu::fp8_vec128_scales(cols, rows));
  const size_t n_sq = static_cast<size_t>(cu::fp8_blk128_scales(rows, cols)), n_sqt = static_cast<size_t>(cu::fp8_blk128_scales(cols, rows));
  float* s_row = upload(std::vector<float>(n_row, 0.0f));
  float* s_col = upload(std::vector<float>(n_col, 0.0f));
  float* s_sq = upload(std::vector<float>(n_sq, 0.0f));
  float* s_sqt = upload(std::vector<float>(n_sqt, 0.0f));
  cu::fp8_quantize_1x128(bx, rows, cols, type, q[0], s_row, q[1], s_col, nullptr);
  cu::fp8_quantize_128x128(bx, rows, cols, type, q[2], s_sq, q[3], s_sqt, nullptr);
  cudaDeviceSynchronize();
  std::vector<float> want_row(n), want_col_t(n), want_sq(n), want_sq_t(n);
  mt::cpu::fp8_quantize_blocks(want_row.data(), xf.data(), rows, cols, 1, 128, f);
  mt::cpu::fp8_quantize_blocks(want_col_t.data(), xt.data(), cols, rows, 1, 128, f);  // (128 x 1 blocks of x, as rows of x^T)
  mt::cpu::fp8_quantize_blocks(want_sq.data(), xf.data(), rows, cols, 128, 128, f);
  mt::cpu::fp8_quantize_blocks(want_sq_t.data(), xt.data(), cols, rows, 128, 128, f);
  const std::vector<float> got[4] = {block_values(download(q[0], n), download(s_row, n_row), rows, cols, 1, 128, f),
                                     block_values(download(q[1], n), download(s_col, n_col), cols, rows, 1, 128, f),
                                     block_values(download(q[2], n), download(s_sq, n_sq), rows, cols, 128, 128, f),
                                     block_values(download(q[3], n), download(s_sqt, n_sqt), cols, rows, 128, 128, f)};
  const std::vector<float>* want[4] = {&want_row, &want_col_t, &want_sq, &want_sq_t};
  size_t bad[4] = {};
  for (int k = 0; k < 4; ++k) {
    for (size_t i = 0; i < n; ++i) bad[k] += std::memcmp(&got[k][i], &(*want[k])[i], 4) != 0;
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "fp8 blockwise quantisation %s %lldx%lld against the CPU's blocks: %zu (1 x 128) + %zu (128 x 1, transposed) + %zu + %zu "
                "(128 x 128 and its transpose) values differ",
                type == cu::Fp8Type::kE5M2 ? "E5M2" : "E4M3", static_cast<long long>(rows), static_cast<long long>(cols), bad[0], bad[1], bad[2], bad[3]);
  check(bad[0] + bad[1] + bad[2] + bad[3] == 0, buf);
  cudaFree(dx);
  for (auto* b : q) cudaFree(b);
  for (float* p : {s_row, s_col, s_sq, s_sqt}) cudaFree(p);
}

// The block-scaled GEMMs as the linear layers call them: forward / data gradient y [M, N] = x [M, K] (1 x 128) . W [N, K]^T
// (128 x 128), bf16 out; weight gradient C [M, N] += dy^T [M, K] . x^T [N, K]^T, both 1 x 128 along K, fp32 accumulated.
// Against the sums of the dequantised operands in double: within fp32 accumulation (relative 1e-5 of the row's scale).
void test_block_gemm(bool weight_gradient, int64_t M, int64_t N, int64_t K, mt::cuda::Fp8Type a_type) {
  namespace cu = mt::cuda;
  using Mode = cu::GemmLt::ScaleMode;
  const auto fa = cpu_format(a_type);
  const std::vector<uint16_t> a16 = test_values(static_cast<size_t>(M * K), 21, 1.0f), b16 = test_values(static_cast<size_t>(N * K), 23, 0.05f);
  auto* da = upload(a16);
  auto* db = upload(b16);
  auto* qa = upload(std::vector<uint8_t>(a16.size()));
  auto* qb = upload(std::vector<uint8_t>(b16.size()));
  float* sa = upload(std::vector<float>(static_cast<size_t>(cu::fp8_vec128_scales(M, K)), 0.0f));
  const size_t nb = static_cast<size_t>(weight_gradient ? cu::fp8_vec128_scales(N, K) : cu::fp8_blk128_scales(N, K));
  float* sb = upload(std::vector<float>(nb, 0.0f));
  cu::fp8_quantize_1x128(reinterpret_cast<const cu::bf16*>(da), M, K, a_type, qa, sa, nullptr, nullptr, nullptr);
  if (weight_gradient) cu::fp8_quantize_1x128(reinterpret_cast<const cu::bf16*>(db), N, K, cu::Fp8Type::kE4M3, qb, sb, nullptr, nullptr, nullptr);
  else cu::fp8_quantize_128x128(reinterpret_cast<const cu::bf16*>(db), N, K, cu::Fp8Type::kE4M3, qb, sb, nullptr, nullptr, nullptr);
  std::vector<float> c0(static_cast<size_t>(M * N), 0.0f);
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = weight_gradient ? static_cast<float>(static_cast<int>(i % 5) - 2) * 0.5f : 0.0f;
  void* dc = weight_gradient ? static_cast<void*>(upload(c0)) : static_cast<void*>(upload(std::vector<uint16_t>(c0.size(), 0)));
  cudaDeviceSynchronize();
  const auto va = block_values(download(qa, a16.size()), download(sa, static_cast<size_t>(cu::fp8_vec128_scales(M, K))), M, K, 1, 128, fa);
  const auto vb = block_values(download(qb, b16.size()), download(sb, nb), N, K, weight_gradient ? 1 : 128, 128, mt::cpu::Fp8Format::kE4M3);
  std::string error;
  try {
    cu::GemmLt::instance().gemm_fp8(M, N, K, 1.0f, qa, a_type == cu::Fp8Type::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, sa, qb, CUDA_R_8F_E4M3, sb,
                                    weight_gradient ? 1.0f : 0.0f, dc, N, weight_gradient ? CUDA_R_32F : CUDA_R_16BF, nullptr, false, nullptr,
                                    Mode::kVec128, weight_gradient ? Mode::kVec128 : Mode::kBlock128);
    cudaDeviceSynchronize();
  } catch (const std::exception& e) {
    error = e.what();
  }
  double worst = 0;
  if (error.empty()) {
    std::vector<float> got(c0.size());
    if (weight_gradient) {
      got = download(static_cast<float*>(dc), c0.size());
    } else {
      const auto g16 = download(static_cast<uint16_t*>(dc), c0.size());
      for (size_t i = 0; i < got.size(); ++i) got[i] = mt::bf16_to_float(g16[i]);
    }
    for (int64_t m = 0; m < M; ++m) {
      double scale = 1e-30, diff = 0;
      for (int64_t n = 0; n < N; ++n) {
        double acc = c0[static_cast<size_t>(m * N + n)], mag = std::fabs(acc);
        for (int64_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(va[static_cast<size_t>(m * K + k)]) * vb[static_cast<size_t>(n * K + k)];
          acc += p;
          mag += std::fabs(p);
        }
        scale = std::max(scale, mag);
        diff = std::max(diff, std::fabs(acc - got[static_cast<size_t>(m * N + n)]));
      }
      worst = std::max(worst, diff / scale);
    }
  }
  const double tolerance = weight_gradient ? 1e-5 : 8e-3;  // (bf16 output: its rounding)
  char buf[320];
  std::snprintf(buf, sizeof(buf), "fp8 block-scaled GEMM %s %lldx%lldx%lld (%s): worst error %.2e of the row's magnitude%s%s",
                weight_gradient ? "1D x 1D, fp32 accumulated" : "1 x 128 by 128 x 128, bf16 out", static_cast<long long>(M), static_cast<long long>(N),
                static_cast<long long>(K), a_type == cu::Fp8Type::kE5M2 ? "E5M2 x E4M3" : "E4M3", worst, error.empty() ? "" : ": ", error.c_str());
  check(error.empty() && worst < tolerance, buf);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(qa), static_cast<void*>(qb), static_cast<void*>(sa),
                  static_cast<void*>(sb), dc}) {
    cudaFree(p);
  }
}

// The update kernel on many tensors' histories (zeros, infinities, tiny and ordinary amaxes) against the host rule.
void test_delayed_update(int64_t len, bool max_algo) {
  const int64_t n = 1000, stride = 3 * n;  // one kind of a state [len][3][n]
  std::vector<float> hist(static_cast<size_t>(len * stride), 0.0f), scale(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    scale[static_cast<size_t>(i)] = 1.0f + static_cast<float>(i % 13);
    for (int64_t e = 0; e < len; ++e) {
      const uint32_t r = mt::philox4x32(static_cast<uint64_t>(i * len + e), 0, 5).v[0];
      float v = std::ldexp(static_cast<float>(r % 1000) / 100.0f, static_cast<int>(r % 41) - 20);
      if (r % 17 == 0) v = 0.0f;
      if (r % 97 == 0) v = std::numeric_limits<float>::infinity();
      if (r % 89 == 0) v = 1e-42f;
      hist[static_cast<size_t>(e * stride + i)] = v;
    }
  }
  std::vector<float> want_hist = hist, want_scale = scale;
  for (int64_t i = 0; i < n; ++i) {
    want_scale[static_cast<size_t>(i)] = mt::fp8_delayed_update(want_hist.data() + i, stride, len, max_algo, 448.0f, want_scale[static_cast<size_t>(i)]);
  }
  auto* dh = upload(hist);
  auto* ds = upload(scale);
  mt::cuda::fp8_delayed_update(ds, dh, n, stride, len, max_algo, 448.0f, nullptr);
  cudaDeviceSynchronize();
  const auto got_hist = download(dh, hist.size());
  const auto got_scale = download(ds, scale.size());
  size_t bad = 0;
  for (size_t i = 0; i < hist.size(); ++i) bad += std::memcmp(&got_hist[i], &want_hist[i], 4) != 0;
  for (size_t i = 0; i < scale.size(); ++i) bad += std::memcmp(&got_scale[i], &want_scale[i], 4) != 0;
  check(bad == 0, "fp8 delayed-scaling update, history " + std::to_string(len) + (max_algo ? ", max" : ", most_recent") + ": " + std::to_string(bad) +
                      " values differ from the host rule");
  cudaFree(dh);
  cudaFree(ds);
}

// A [M, K] and B [N, K] FP8 bytes of values in {0, +-0.5, +-1, +-1.5, +-2} (E4M3 and E5M2 both hold them): every
// product and every partial sum is exact in fp32, so the GEMM has one right answer.
void test_gemm(cudaDataType_t a_type, bool bf16_out, bool bias, bool fast) {
  const int64_t M = 32, N = 48, K = 64;
  const float values[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f, 2.0f, -2.0f};
  const auto af = a_type == CUDA_R_8F_E5M2 ? mt::cpu::Fp8Format::kE5M2 : mt::cpu::Fp8Format::kE4M3;
  std::vector<uint8_t> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(N * K));
  std::vector<float> Av(A.size()), Bv(B.size());
  for (size_t i = 0; i < A.size(); ++i) {
    Av[i] = values[mt::philox4x32(i, 0, 3).v[0] % 9];
    A[i] = mt::cpu::fp8_encode(Av[i], af);
  }
  for (size_t i = 0; i < B.size(); ++i) {
    Bv[i] = values[mt::philox4x32(i, 0, 4).v[0] % 9];
    B[i] = mt::cpu::fp8_encode(Bv[i], mt::cpu::Fp8Format::kE4M3);
  }
  const float sa = 0.5f, sb = 0.25f, alpha = 2.0f, beta = bf16_out ? 0.0f : 1.0f;
  std::vector<float> C0(static_cast<size_t>(M * N)), bias_v(static_cast<size_t>(N));
  for (size_t i = 0; i < C0.size(); ++i) C0[i] = static_cast<float>(static_cast<int>(i % 7) - 3) * 0.125f;
  for (size_t j = 0; j < bias_v.size(); ++j) bias_v[j] = static_cast<float>(static_cast<int>(j % 5) - 2) * 0.25f;
  std::vector<float> want(C0.size());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(Av[static_cast<size_t>(m * K + k)]) * Bv[static_cast<size_t>(n * K + k)];
      double v = alpha * sa * sb * acc + beta * C0[static_cast<size_t>(m * N + n)] + (bias ? bias_v[static_cast<size_t>(n)] : 0.0);
      want[static_cast<size_t>(m * N + n)] = bf16_out ? mt::bf16_to_float(mt::float_to_bf16(static_cast<float>(v))) : static_cast<float>(v);
    }
  }
  auto* dA = upload(A);
  auto* dB = upload(B);
  auto* scale_a = upload(std::vector<float>{sa});
  auto* scale_b = upload(std::vector<float>{sb});
  std::vector<uint16_t> bias16(bias_v.size());
  for (size_t j = 0; j < bias16.size(); ++j) bias16[j] = mt::float_to_bf16(bias_v[j]);
  auto* dbias = upload(bias16);
  std::vector<float> got(C0.size());
  try {
    if (bf16_out) {
      auto* dC = upload(std::vector<uint16_t>(C0.size()));
      mt::cuda::GemmLt::instance().gemm_fp8(M, N, K, alpha, dA, a_type, scale_a, dB, CUDA_R_8F_E4M3, scale_b, 0.0f, dC, N, CUDA_R_16BF,
                                            bias ? dbias : nullptr, fast, nullptr);
      cudaDeviceSynchronize();
      const auto c = download(dC, C0.size());
      for (size_t i = 0; i < c.size(); ++i) got[i] = mt::bf16_to_float(c[i]);
      cudaFree(dC);
    } else {
      auto* dC = upload(C0);
      mt::cuda::GemmLt::instance().gemm_fp8(M, N, K, alpha, dA, a_type, scale_a, dB, CUDA_R_8F_E4M3, scale_b, beta, dC, N, CUDA_R_32F, nullptr, fast,
                                            nullptr);
      cudaDeviceSynchronize();
      got = download(dC, C0.size());
      cudaFree(dC);
    }
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
    char buf[200];
    std::snprintf(buf, sizeof(buf), "fp8 GEMM %s x E4M3 -> %s%s, %s accumulation: %zu of %zu outputs differ from the exact sums",
                  a_type == CUDA_R_8F_E5M2 ? "E5M2" : "E4M3", bf16_out ? "bf16" : "fp32 (beta 1)", bias ? " + bias" : "", fast ? "fast" : "precise",
                  bad, got.size());
    check(bad == 0, buf);
  } catch (const std::exception& e) {
    check(false, std::string("fp8 GEMM: ") + e.what());
  }
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(scale_a);
  cudaFree(scale_b);
  cudaFree(dbias);
}

// y = x W^T through the engine's FP8 path (amax, cast, GEMM with the inverse scales) against the CPU emulation of
// the same bf16 inputs: equal up to fp32 summation order and the output's bf16 rounding.
void test_linear(int64_t T, int64_t in, int64_t out) {
  std::vector<uint16_t> x(static_cast<size_t>(T * in)), w(static_cast<size_t>(out * in));
  std::vector<float> xf(x.size()), wf(w.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = mt::bf16_to_float(x[i] = mt::float_to_bf16(mt::philox_normal(11, i)));
  for (size_t i = 0; i < w.size(); ++i) wf[i] = mt::bf16_to_float(w[i] = mt::float_to_bf16(0.02f * mt::philox_normal(12, i)));
  const auto e4m3 = mt::cpu::Fp8Format::kE4M3;
  const float sx = mt::cpu::fp8_scale_from_amax(mt::cpu::abs_max(xf.data(), T * in), e4m3);
  const float sw = mt::cpu::fp8_scale_from_amax(mt::cpu::abs_max(wf.data(), out * in), e4m3);
  std::vector<float> xq(xf.size()), wq(wf.size());
  mt::cpu::fp8_quantize(xq.data(), xf.data(), T * in, sx, e4m3);
  mt::cpu::fp8_quantize(wq.data(), wf.data(), out * in, sw, e4m3);
  auto* dx = upload(x);
  auto* dw = upload(w);
  auto* scalar_buf = upload(std::vector<float>(4 * 64));
  float* scalars[4] = {scalar_buf, scalar_buf + 64, scalar_buf + 128, scalar_buf + 192};  // 256 bytes apart
  auto* qx = upload(std::vector<uint8_t>(x.size()));
  auto* qw = upload(std::vector<uint8_t>(w.size()));
  auto* dy = upload(std::vector<uint16_t>(static_cast<size_t>(T * out)));
  const auto* bx = reinterpret_cast<const mt::cuda::bf16*>(dx);
  const auto* bw = reinterpret_cast<const mt::cuda::bf16*>(dw);
  mt::cuda::fp8_amax(bx, T * in, scalars[0], nullptr);
  mt::cuda::fp8_cast(bx, T, in, scalars[0], mt::cuda::Fp8Type::kE4M3, qx, nullptr, scalars[2], nullptr);
  mt::cuda::fp8_amax(bw, out * in, scalars[1], nullptr);
  mt::cuda::fp8_cast(bw, out, in, scalars[1], mt::cuda::Fp8Type::kE4M3, qw, nullptr, scalars[3], nullptr);
  try {
    mt::cuda::GemmLt::instance().gemm_fp8(T, out, in, 1.0f, qx, CUDA_R_8F_E4M3, scalars[2], qw, CUDA_R_8F_E4M3, scalars[3], 0.0f, dy, out, CUDA_R_16BF,
                                          nullptr, true, nullptr);
  } catch (const std::exception& e) {
    check(false, std::string("fp8 linear: ") + e.what());
  }
  cudaDeviceSynchronize();
  const auto y = download(dy, static_cast<size_t>(T * out));
  double worst = 0, ymax = 0;
  size_t equal = 0;
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += static_cast<double>(xq[static_cast<size_t>(i * in + k)]) * wq[static_cast<size_t>(j * in + k)];
      const float want = mt::bf16_to_float(mt::float_to_bf16(static_cast<float>(acc * (1.0 / sx) * (1.0 / sw))));
      const float got = mt::bf16_to_float(y[static_cast<size_t>(i * out + j)]);
      worst = std::max(worst, std::fabs(static_cast<double>(got) - want));
      ymax = std::max(ymax, std::fabs(static_cast<double>(want)));
      equal += got == want;
    }
  }
  char buf[200];
  std::snprintf(buf, sizeof(buf), "fp8 linear %lldx%lldx%lld against the CPU emulation: worst |diff| / max |y| %.2e, %.1f%% equal", static_cast<long long>(T),
                static_cast<long long>(in), static_cast<long long>(out), worst / ymax, 100.0 * static_cast<double>(equal) / static_cast<double>(y.size()));
  check(worst / ymax < 8e-3 && equal * 10 > y.size() * 9, buf);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(scalar_buf), static_cast<void*>(qx), static_cast<void*>(qw),
                  static_cast<void*>(dy)}) {
    cudaFree(p);
  }
}

}  // namespace

int main() {
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible (%s)\n", mt::gpu_unavailable_reason().c_str());
    return 77;
  }
  for (auto t : {mt::cuda::Fp8Type::kE4M3, mt::cuda::Fp8Type::kE5M2}) {
    test_cast(t, 48, 80, 1.0f);
    test_cast(t, 257, 33, 1e-3f);
    test_cast(t, 64, 64, 0.0f);
    test_cast(t, 192, 2048, 0.5f);  // tiles of the vectorised path
  }
  for (auto t : {mt::cuda::Fp8Type::kE4M3, mt::cuda::Fp8Type::kE5M2}) {
    test_cast_scaled(t, 48, 80, 1.0f, 64.0f, 0.0f);        // the 32 x 32 path; values past the maximum saturate
    test_cast_scaled(t, 192, 2048, 0.5f, 1.0f, 1e30f);     // the vectorised path; the accumulator's prior amax stays
    test_cast_scaled(t, 257, 33, 1e-3f, 4096.0f, 1e-9f);
  }
  for (bool backward : {false, true}) {
    test_fused_swiglu(mt::cuda::Fp8Type::kE4M3, backward, 256, 512, 8.0f);
    test_fused_swiglu(mt::cuda::Fp8Type::kE5M2, backward, 200, 72, 64.0f);  // edge tiles; values past the maximum saturate
  }
  for (auto t : {mt::cuda::Fp8Type::kE4M3, mt::cuda::Fp8Type::kE5M2}) {
    test_block_quantize(t, 256, 384);
    test_block_quantize(t, 200, 136);  // blocks cut at both edges
  }
  test_block_gemm(false, 256, 384, 512, mt::cuda::Fp8Type::kE4M3);
  test_block_gemm(false, 256, 384, 512, mt::cuda::Fp8Type::kE5M2);
  test_block_gemm(true, 384, 256, 512, mt::cuda::Fp8Type::kE5M2);
  test_block_gemm(false, 208, 144, 336, mt::cuda::Fp8Type::kE4M3);  // K and the rows not multiples of 128
  for (int64_t len : {1, 4}) {
    test_delayed_update(len, false);
    test_delayed_update(len, true);
  }
  for (bool fast : {true, false}) {
    test_gemm(CUDA_R_8F_E4M3, false, false, fast);
    test_gemm(CUDA_R_8F_E5M2, false, false, fast);
    test_gemm(CUDA_R_8F_E4M3, true, true, fast);
  }
  test_linear(256, 512, 384);
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
