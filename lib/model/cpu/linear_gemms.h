// linear_gemms.h: one linear layer's three GEMMs (forward, input gradient, weight gradient) in its layer's
// precision: fp32, or FP8 emulated as Transformer Engine computes it on Hopper with tensorwise (current)
// scaling. FP8: the input x and the weight W are scaled by max / amax and rounded to E4M3, the output gradient
// dy to E5M2 (--fp8-format hybrid) or E4M3; each GEMM multiplies the FP8 values exactly, sums in fp32 and
// scales the result back by both inverse scales:
//   y = (xq Wq^T) / (sx sw) + b,   dx = (dyq Wq) / (sdy sw),   dW += (dyq^T xq) / (sdy sx)   (fp32 x, dy with --no-fp8-wgrad)
// and db from the unquantised dy. An amax is the whole tensor's: reduced (max) over TP, and for activations and
// gradients over CP, so that every layout quantises what one rank would. With the delayed recipe (c.fp8 set) the
// scales come from the stage's scaling state instead, and each tensor's amax goes to its accumulator
// (model/fp8_scaling.h); `site` is the layer's linear site (kLinearQkv .., or an MoE layer's fp8_expert_site).
#pragma once

#include "model/cpu/pass_context.h"
#include "model/layout.h"

namespace mt::cpu {

// What a linear layer's backward needs from its forward under FP8: the quantised input and weight (the FP8
// values, unscaled) and their inverse scales.
enum LinearSite : int { kLinearQkv = 0, kLinearProj = 1, kLinearFc1 = 2, kLinearFc2 = 3 };

struct LinearStash {
  Buf xq, wq;
  float x_inv = 1, w_inv = 1;
};

// y[N, out] = x[N, in] W^T (+ b) in layer `layer`'s precision; x must stay valid until the backward.
void linear_unit_forward(const PassContext& c, int64_t layer, int site, LinearStash& s, float* y, const float* x, size_t w, size_t b, int64_t N,
                         int64_t in, int64_t out);
// dx[N, in] = dy W (overwritten), then the weight gradient dW (and db when b != kNoParam) through c.weight_grad.
void linear_unit_backward(const PassContext& c, int64_t layer, int site, LinearStash& s, float* dx, const float* dy, size_t w, size_t b,
                          const float* x, int64_t N, int64_t in, int64_t out);

}  // namespace mt::cpu
