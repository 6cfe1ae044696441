// test_cuda_fp8.cpp: the CUDA engine's FP8 pieces against the CPU emulation (kernels/cpu/fp8) on the GPU machine:
// the amax and the cast (row-major and transposed, E4M3 and E5M2, tiles cut at the edges) byte for byte; the
// FP8 GEMM (cuBLASLt, "TN", device scales, fp32 and bf16 outputs, bias, fast and precise accumulation) bit for
// bit on operands whose sums are exact in fp32 (and with plans that vary with M and K, as the MoE experts' do); a linear layer's forward in FP8 on random data within fp32
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
#include "gpu_check.h"
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

using mt::test::check;
using mt::test::failures;
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

// A power of 2 per 128 x 128 block (2^-2 .. 2^2), and with per_row per row too: blocks get scales of their own, so a
// scale read from the wrong place shows. (The GEMM test leaves rows out: a block's products then share one power of 2,
// and its sums stay exact within the tensor cores' accumulator.)
float block_factor(int64_t r, int64_t c, bool per_row) {
  return std::ldexp(1.0f, static_cast<int>((7 * (r / 128) + 3 * (c / 128) + (per_row ? r % 3 : 0)) % 5) - 2);
}

void test_block_quantize(mt::cuda::Fp8Type type, int64_t rows, int64_t cols) {
  namespace cu = mt::cuda;
  const auto f = cpu_format(type);
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> x = test_values(n, 17, 3.0f);
  std::vector<float> xf(n), xt(n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      x[i] = mt::float_to_bf16(mt::bf16_to_float(x[i]) * block_factor(r, c, true));  // (exact: a power of 2)
      xf[i] = mt::bf16_to_float(x[i]);
      xt[static_cast<size_t>(c * rows + r)] = xf[i];
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

// The block-scaled GEMMs exactly as the linear layers call them, each operand quantised by the kernels above (the
// transposed outputs included) from bf16 values in {0, +-0.5, +-1, +-1.5, +-2} times a power of 2 per 128 x 128 block:
// every block's products and sums are exact in the tensor cores' accumulator and in fp32, so each GEMM has one right
// answer, and a scale read from another block than cuBLASLt's layout says gives another.
//   kForward: y [T, out] = x [T, in] (1 x 128) . W [out, in]^T (128 x 128), bf16 out
//   kDgrad:   dx [T, in] = dy [T, out] (1 x 128) . (W^T [in, out], the 128 x 128 quantisation's transpose)^T, bf16 out
//   kWgrad:   dW [out, in] += dy^T [out, T] . x^T [in, T]^T, both the 1 x 128 quantisation's transposes, fp32 accumulated
enum class BlockGemm { kForward, kDgrad, kWgrad };
// varying: as an MoE expert's GEMMs run them (T, the tokens, from a plan of T's 256-row bucket, which an earlier call may
// have made for another T).
void test_block_gemm(BlockGemm kind, int64_t T, int64_t in, int64_t out, mt::cuda::Fp8Type grad_type, bool varying = false) {
  namespace cu = mt::cuda;
  using Mode = cu::GemmLt::ScaleMode;
  const float values[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 1.5f, -1.5f, 2.0f, -2.0f};
  auto make = [&](int64_t rows, int64_t cols, uint64_t key) {
    std::vector<uint16_t> v(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        v[i] = mt::float_to_bf16(values[mt::philox4x32(i, 0, key).v[0] % 9] * block_factor(r, c, false));
      }
    }
    return v;
  };
  // The two 16-bit tensors quantised: the activation-like one [T, K1] in 1 x 128 blocks (with its transpose), W [out, in].
  const bool fwd = kind == BlockGemm::kForward, wgrad = kind == BlockGemm::kWgrad;
  const int64_t a_cols = fwd ? in : out;  // x [T, in] or dy [T, out]
  const auto fa = wgrad || !fwd ? cpu_format(grad_type) : mt::cpu::Fp8Format::kE4M3;
  const auto ta = fwd ? cu::Fp8Type::kE4M3 : grad_type;
  const std::vector<uint16_t> a16 = make(T, a_cols, 31), b16 = wgrad ? make(T, in, 37) : make(out, in, 41);
  const int64_t b_rows = wgrad ? T : out, b_cols = in;
  auto* da = upload(a16);
  auto* db = upload(b16);
  const size_t na = a16.size(), nb = b16.size();
  auto* qa = upload(std::vector<uint8_t>(na)), *qa_t = upload(std::vector<uint8_t>(na));
  auto* qb = upload(std::vector<uint8_t>(nb)), *qb_t = upload(std::vector<uint8_t>(nb));
  const size_t s_a = static_cast<size_t>(cu::fp8_vec128_scales(T, a_cols)), s_at = static_cast<size_t>(cu::fp8_vec128_scales(a_cols, T));
  const size_t s_b = static_cast<size_t>(wgrad ? cu::fp8_vec128_scales(b_rows, b_cols) : cu::fp8_blk128_scales(b_rows, b_cols));
  const size_t s_bt = static_cast<size_t>(wgrad ? cu::fp8_vec128_scales(b_cols, b_rows) : cu::fp8_blk128_scales(b_cols, b_rows));
  float *sa = upload(std::vector<float>(s_a, 0.0f)), *sa_t = upload(std::vector<float>(s_at, 0.0f));
  float *sb = upload(std::vector<float>(s_b, 0.0f)), *sb_t = upload(std::vector<float>(s_bt, 0.0f));
  cu::fp8_quantize_1x128(reinterpret_cast<const cu::bf16*>(da), T, a_cols, ta, qa, sa, qa_t, sa_t, nullptr);
  if (wgrad) cu::fp8_quantize_1x128(reinterpret_cast<const cu::bf16*>(db), b_rows, b_cols, cu::Fp8Type::kE4M3, qb, sb, qb_t, sb_t, nullptr);
  else cu::fp8_quantize_128x128(reinterpret_cast<const cu::bf16*>(db), b_rows, b_cols, cu::Fp8Type::kE4M3, qb, sb, qb_t, sb_t, nullptr);
  cudaDeviceSynchronize();
  // The GEMM's operands [M, K] and [N, K] and their dequantised values.
  const auto e4 = mt::cpu::Fp8Format::kE4M3;
  int64_t M = 0, N = 0, K = 0;
  std::vector<float> va, vb;
  const uint8_t *opa = nullptr, *opb = nullptr;
  const float *sca = nullptr, *scb = nullptr;
  Mode mode_b = Mode::kBlock128;
  if (fwd) {
    M = T, N = out, K = in;
    va = block_values(download(qa, na), download(sa, s_a), T, in, 1, 128, fa);
    vb = block_values(download(qb, nb), download(sb, s_b), out, in, 128, 128, e4);
    opa = qa, sca = sa, opb = qb, scb = sb;
  } else if (kind == BlockGemm::kDgrad) {
    M = T, N = in, K = out;
    va = block_values(download(qa, na), download(sa, s_a), T, out, 1, 128, fa);
    vb = block_values(download(qb_t, nb), download(sb_t, s_bt), in, out, 128, 128, e4);
    opa = qa, sca = sa, opb = qb_t, scb = sb_t;
  } else {
    M = out, N = in, K = T;
    va = block_values(download(qa_t, na), download(sa_t, s_at), out, T, 1, 128, fa);
    vb = block_values(download(qb_t, nb), download(sb_t, s_bt), in, T, 1, 128, e4);
    opa = qa_t, sca = sa_t, opb = qb_t, scb = sb_t, mode_b = Mode::kVec128;
  }
  std::vector<float> c0(static_cast<size_t>(M * N), 0.0f);
  for (size_t i = 0; i < c0.size(); ++i) c0[i] = wgrad ? static_cast<float>(static_cast<int>(i % 5) - 2) * 0.125f : 0.0f;
  void* dc = wgrad ? static_cast<void*>(upload(c0)) : static_cast<void*>(upload(std::vector<uint16_t>(c0.size(), 0)));
  std::string error;
  try {
    cu::GemmLt::instance().gemm_fp8(M, N, K, 1.0f, opa, ta == cu::Fp8Type::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, sca, opb, CUDA_R_8F_E4M3, scb,
                                    wgrad ? 1.0f : 0.0f, dc, N, wgrad ? CUDA_R_32F : CUDA_R_16BF, nullptr, false, nullptr, Mode::kVec128, mode_b,
                                    varying);
    cudaDeviceSynchronize();
  } catch (const std::exception& e) {
    error = e.what();
  }
  size_t bad = 0;
  double worst = 0;
  if (error.empty()) {
    const auto g32 = wgrad ? download(static_cast<float*>(dc), c0.size()) : std::vector<float>();
    const auto g16 = wgrad ? std::vector<uint16_t>() : download(static_cast<uint16_t*>(dc), c0.size());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n2 = 0; n2 < N; ++n2) {
        double acc = c0[static_cast<size_t>(m * N + n2)];
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(va[static_cast<size_t>(m * K + k)]) * vb[static_cast<size_t>(n2 * K + k)];
        const size_t i = static_cast<size_t>(m * N + n2);
        const float want = wgrad ? static_cast<float>(acc) : mt::bf16_to_float(mt::float_to_bf16(static_cast<float>(acc)));
        const float got = wgrad ? g32[i] : mt::bf16_to_float(g16[i]);
        bad += got != want;
        worst = std::max(worst, std::fabs(static_cast<double>(got) - want));
      }
    }
  }
  static const char* names[] = {"forward (1 x 128 by 128 x 128, bf16 out)", "data gradient (dy by W^T's blocks, bf16 out)",
                                "weight gradient (dy^T by x^T, 1 x 128 along tokens, fp32 accumulated)"};
  char buf[360];
  std::snprintf(buf, sizeof(buf), "fp8 block-scaled GEMM%s, %s, T %lld in %lld out %lld, %s: %zu values differ from the exact sums (worst %.3g)%s%s",
                varying ? " (varying plan)" : "", names[static_cast<int>(kind)], static_cast<long long>(T), static_cast<long long>(in), static_cast<long long>(out),
                grad_type == cu::Fp8Type::kE5M2 ? "gradients E5M2" : "all E4M3", bad, worst, error.empty() ? "" : ": ", error.c_str());
  check(error.empty() && bad == 0, buf);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(qa), static_cast<void*>(qa_t), static_cast<void*>(qb),
                  static_cast<void*>(qb_t), static_cast<void*>(sa), static_cast<void*>(sa_t), static_cast<void*>(sb), static_cast<void*>(sb_t), dc}) {
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
// varying: the plan of M's and K's 256-row buckets, as an MoE expert's GEMMs take it (tokens are M forward, K for the
// weight gradient), after a call of other sizes in the same buckets made it.
void test_gemm(cudaDataType_t a_type, bool bf16_out, bool bias, bool fast, int64_t M = 32, int64_t K = 64, bool varying = false) {
  const int64_t N = 48;
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
  using Mode = mt::cuda::GemmLt::ScaleMode;
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
                                            bias ? dbias : nullptr, fast, nullptr, Mode::kTensor, Mode::kTensor, varying);
      cudaDeviceSynchronize();
      const auto c = download(dC, C0.size());
      for (size_t i = 0; i < c.size(); ++i) got[i] = mt::bf16_to_float(c[i]);
      cudaFree(dC);
    } else {
      auto* dC = upload(C0);
      mt::cuda::GemmLt::instance().gemm_fp8(M, N, K, alpha, dA, a_type, scale_a, dB, CUDA_R_8F_E4M3, scale_b, beta, dC, N, CUDA_R_32F, nullptr, fast,
                                            nullptr, Mode::kTensor, Mode::kTensor, varying);
      cudaDeviceSynchronize();
      got = download(dC, C0.size());
      cudaFree(dC);
    }
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
    char buf[200];
    std::snprintf(buf, sizeof(buf), "fp8 GEMM%s M %lld K %lld, %s x E4M3 -> %s%s, %s accumulation: %zu of %zu outputs differ from the exact sums",
                  varying ? " (varying plan)" : "", static_cast<long long>(M), static_cast<long long>(K), a_type == CUDA_R_8F_E5M2 ? "E5M2" : "E4M3", bf16_out ? "bf16" : "fp32 (beta 1)", bias ? " + bias" : "", fast ? "fast" : "precise",
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
  for (auto kind : {BlockGemm::kForward, BlockGemm::kDgrad, BlockGemm::kWgrad}) {
    test_block_gemm(kind, 384, 256, 640, mt::cuda::Fp8Type::kE5M2);  // (more row blocks than column blocks, and the reverse)
    test_block_gemm(kind, 256, 512, 384, mt::cuda::Fp8Type::kE4M3);
    test_block_gemm(kind, 208, 144, 336, mt::cuda::Fp8Type::kE5M2);  // no dimension a multiple of 128
  }
  for (int64_t len : {1, 4}) {
    test_delayed_update(len, false);
    test_delayed_update(len, true);
  }
  for (bool fast : {true, false}) {
    test_gemm(CUDA_R_8F_E4M3, false, false, fast);
    test_gemm(CUDA_R_8F_E5M2, false, false, fast);
    test_gemm(CUDA_R_8F_E4M3, true, true, fast);
  }
  // Varying plans (the MoE experts' FP8 GEMMs): a bucket's plan made by its largest size first, then smaller ones in it;
  // the tokens as M (forward, data gradient) and as K (weight gradient); fewer plans than sizes.
  const size_t plans = mt::cuda::GemmLt::instance().cached_fp8_plans();
  for (int64_t M : {240, 48, 16, 272}) test_gemm(CUDA_R_8F_E4M3, true, true, true, M, 64, true);
  for (int64_t K : {256, 208, 32}) test_gemm(CUDA_R_8F_E5M2, false, false, false, 48, K, true);
  const size_t added = mt::cuda::GemmLt::instance().cached_fp8_plans() - plans;
  check(added < 7, "fp8 varying GEMMs: " + std::to_string(added) + " plans for 7 sizes in 3 buckets (fewer plans than sizes)");
  for (int64_t T : {496, 400, 144}) {
    test_block_gemm(BlockGemm::kForward, T, 256, 384, mt::cuda::Fp8Type::kE4M3, true);
    test_block_gemm(BlockGemm::kDgrad, T, 256, 384, mt::cuda::Fp8Type::kE5M2, true);
    test_block_gemm(BlockGemm::kWgrad, T, 256, 384, mt::cuda::Fp8Type::kE5M2, true);
  }
  test_linear(256, 512, 384);
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
