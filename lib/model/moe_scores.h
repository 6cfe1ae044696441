// moe_scores.h: the router's element-wise score functions (--moe-router-score-function sigmoid | sqrtsoftplus), one
// definition for both engines (kernels/cpu/router.cpp and kernels/cuda/moe.cu), computed in double and rounded to fp32.
#pragma once

#include <cmath>

#include "tensor/rng.h"  // MT_HD

namespace mt {

// sigmoid(x), or sqrt(softplus(x)) with torch's softplus (beta 1, threshold 20: x itself above it).
MT_HD float moe_elementwise_score(bool sqrtsoftplus, float x) {
  if (!sqrtsoftplus) return static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(x))));
  const double softplus = x > 20.0f ? static_cast<double>(x) : log1p(exp(static_cast<double>(x)));
  return static_cast<float>(sqrt(softplus));
}

// d score / d x at x, given the score s: sigmoid's s (1 - s); sqrtsoftplus's softplus'(x) / (2 s), softplus' being
// sigmoid (1 above torch's threshold).
MT_HD double moe_elementwise_slope(bool sqrtsoftplus, float x, double s) {
  if (!sqrtsoftplus) return s * (1.0 - s);
  const double slope = x > 20.0f ? 1.0 : 1.0 / (1.0 + exp(-static_cast<double>(x)));
  return s > 0 ? slope / (2.0 * s) : 0.0;
}

}  // namespace mt
