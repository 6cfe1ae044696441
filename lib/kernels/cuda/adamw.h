// adamw.h (CUDA): one AdamW step over a flat fp32 range (master weights, moments), with decoupled
// weight decay on the elements whose decay mask is set, clipping folded in as a gradient scale.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mt::cuda {

struct AdamParams {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;  // grad_scale: 1/loss scale x clip factor
  float bias_correction1, bias_correction2;               // 1 - beta^t
};

void adamw_step(float* w, float* m, float* v, const float* g, const uint8_t* decay_mask, int64_t n, const AdamParams& p,
                cudaStream_t stream);

}  // namespace mt::cuda
