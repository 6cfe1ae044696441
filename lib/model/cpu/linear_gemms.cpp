// linear_gemms.cpp: the fp32 path is kernels/cpu/linear's; the FP8 path quantises with kernels/cpu/fp8 and
// multiplies the FP8 values with the same sgemm (their products are exact in fp32).
#include "model/cpu/linear_gemms.h"

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/linear.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace mt::cpu {
namespace {

// Quantises n values into q with the scale of their amax (reduced over TP, and CP when `over_cp`); returns 1 / scale.
float quantize(const PassContext& c, Buf& q, const float* x, int64_t n, Fp8Format format, bool over_cp) {
  float amax = abs_max(x, n);
  if (c.D.tp > 1) c.groups.tp->all_reduce(&amax, 1, ReduceOp::kMax);
  if (over_cp && c.D.cp > 1) c.groups.cp->all_reduce(&amax, 1, ReduceOp::kMax);
  const float scale = fp8_scale_from_amax(amax, format);
  q.resize(sz(n));
  fp8_quantize(q.data(), x, n, scale, format);
  return 1.0f / scale;
}

// Delayed scaling: quantises with the given scale (and adds the amax to *accumulator when not null); returns 1 / scale.
float quantize_scaled(Buf& q, const float* x, int64_t n, float scale, Fp8Format format, float* accumulator) {
  if (accumulator) *accumulator = std::fmax(*accumulator, abs_max(x, n));
  q.resize(sz(n));
  fp8_quantize(q.data(), x, n, scale, format);
  return 1.0f / scale;
}

constexpr int64_t kFp8Block = 128;

// db += the sum over rows of the unquantised dy [N, out] (Transformer Engine's fused cast + bias gradient).
void add_bias_grad(float* db, const float* dy, int64_t N, int64_t out) {
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < out; ++j) db[j] += dy[i * out + j];
  }
}

// Blockwise: dy in 1 x 128 blocks along its rows for the data gradient, and dy and x each in 128 x 1 blocks (128
// tokens of a column: Transformer Engine's columnwise quantisation of the weight gradient's operands) for dW.
void linear_blockwise_backward(const PassContext& c, LinearStash& s, float* dx, const float* dy, size_t w, size_t b, const float* x, int64_t N,
                               int64_t in, int64_t out, Fp8Format grad_format) {
  Buf dyq(sz(N * out));
  fp8_quantize_blocks(dyq.data(), dy, N, out, 1, kFp8Block, grad_format);
  gemm(false, false, N, in, out, 1.0f, dyq.data(), out, s.wq.data(), in, 0.0f, dx, in);
  if (b != kNoParam) add_bias_grad(c.G(b), dy, N, out);
  c.weight_grad(dy, N * out, [&c, w, x, N, in, out, grad_format](const float* g) {
    Buf gq(sz(N * out)), xq(sz(N * in));
    fp8_quantize_blocks(gq.data(), g, N, out, kFp8Block, 1, grad_format);
    fp8_quantize_blocks(xq.data(), x, N, in, kFp8Block, 1, Fp8Format::kE4M3);
    gemm(true, false, out, in, N, 1.0f, gq.data(), out, xq.data(), in, 1.0f, c.G(w), in);
  });
}

// The slot of (layer, site) in the stage's scaling state (site: an expert's, fp8_expert_site, in an MoE layer).
int64_t fp8_slot(const PassContext& c, int64_t layer, int site) {
  const int64_t index = c.fp8->index_of(layer);
  if (index < 0) throw std::logic_error("FP8: layer " + std::to_string(layer) + " has no delayed-scaling state");
  return c.fp8->slot(index, site);
}

}  // namespace

void linear_unit_forward(const PassContext& c, int64_t layer, int site, LinearStash& s, float* y, const float* x, size_t w, size_t b, int64_t N,
                         int64_t in, int64_t out) {
  const float* bias = b != kNoParam ? c.P(b) : nullptr;
  if (!c.D.fp8_layer(layer)) {
    linear_forward(y, x, c.P(w), bias, N, in, out);
    return;
  }
  if (c.D.fp8_blockwise) {  // x in 1 x 128 blocks along its rows, W in 128 x 128 blocks (its transpose: the same blocks)
    s.xq.resize(sz(N * in));
    s.wq.resize(sz(out * in));
    fp8_quantize_blocks(s.xq.data(), x, N, in, 1, kFp8Block, Fp8Format::kE4M3);
    fp8_quantize_blocks(s.wq.data(), c.P(w), out, in, kFp8Block, kFp8Block, Fp8Format::kE4M3);
    s.x_inv = s.w_inv = 1.0f;  // (the blocks' values are held dequantised)
  } else if (c.fp8) {
    Fp8ScalingState& st = *c.fp8;
    const int64_t slot = fp8_slot(c, layer, site);
    const float sx = st.scales(kFp8Input)[slot];
    s.x_inv = quantize_scaled(s.xq, x, N * in, sx, Fp8Format::kE4M3, c.fp8_record ? st.amax_accumulator(kFp8Input) + slot : nullptr);
    // The weight: cast at the iteration's first training microbatch, that cast's scale kept for the rest.
    float sw = st.scales(kFp8Weight)[slot];
    if (c.fp8_cast_weights) st.weight_cast_scale[static_cast<size_t>(slot)] = sw;
    else if (c.training) sw = st.weight_cast_scale[static_cast<size_t>(slot)];
    s.w_inv = quantize_scaled(s.wq, c.P(w), out * in, sw, Fp8Format::kE4M3, c.fp8_cast_weights ? st.amax_accumulator(kFp8Weight) + slot : nullptr);
  } else {
    s.x_inv = quantize(c, s.xq, x, N * in, Fp8Format::kE4M3, true);
    s.w_inv = quantize(c, s.wq, c.P(w), out * in, Fp8Format::kE4M3, false);
  }
  gemm(false, true, N, out, in, s.x_inv * s.w_inv, s.xq.data(), in, s.wq.data(), in, 0.0f, y, out);
  if (c.D.fp8_blockwise) Buf().swap(s.xq);  // (its backward quantises x again, in columns)
  if (bias) {
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = 0; j < out; ++j) y[i * out + j] += bias[j];
    }
  }
}

void linear_unit_backward(const PassContext& c, int64_t layer, int site, LinearStash& s, float* dx, const float* dy, size_t w, size_t b,
                          const float* x, int64_t N, int64_t in, int64_t out) {
  if (!c.D.fp8_layer(layer)) {
    linear_backward_input(dx, dy, c.P(w), N, in, out);
    c.weight_grad(dy, N * out, [&c, w, b, x, N, in, out](const float* g) {
      linear_backward_weight(c.G(w), b != kNoParam ? c.G(b) : nullptr, g, x, N, in, out);
    });
    return;
  }
  const Fp8Format grad_format = c.D.fp8_grad_e5m2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  Buf dyq;
  if (c.D.fp8_blockwise) {
    linear_blockwise_backward(c, s, dx, dy, w, b, x, N, in, out, grad_format);
    return;
  }
  float dy_inv = 0;
  if (c.fp8) {
    const int64_t slot = fp8_slot(c, layer, site);
    dy_inv = quantize_scaled(dyq, dy, N * out, c.fp8->scales(kFp8GradOutput)[slot], grad_format,
                             c.fp8_record ? c.fp8->amax_accumulator(kFp8GradOutput) + slot : nullptr);
  } else {
    dy_inv = quantize(c, dyq, dy, N * out, grad_format, true);
  }
  gemm(false, false, N, in, out, dy_inv * s.w_inv, dyq.data(), out, s.wq.data(), in, 0.0f, dx, in);
  if (b != kNoParam) add_bias_grad(c.G(b), dy, N, out);
  if (!c.D.fp8_wgrad) {
    c.weight_grad(dy, N * out, [&c, w, x, N, in, out](const float* g) { linear_backward_weight(c.G(w), nullptr, g, x, N, in, out); });
    return;
  }
  const float inv = dy_inv * s.x_inv;
  const LinearStash* saved = &s;
  c.weight_grad(dyq.data(), N * out, [&c, w, saved, inv, N, in, out](const float* g) {
    gemm(true, false, out, in, N, inv, g, out, saved->xq.data(), in, 1.0f, c.G(w), in);
  });
}

}  // namespace mt::cpu
