// norm.h: LayerNorm and RMSNorm over the last dimension, forward and backward (fp32 statistics).
#pragma once
#include <cstdint>

namespace mt::cpu {

// out may alias nothing; mean/rstd: [N] saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N,
                       int64_t h, float eps);
// dx is overwritten; dw, db accumulate.
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t h);

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t h, float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t h);

}  // namespace mt::cpu
