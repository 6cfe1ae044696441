// adamw.cu: the update of optim/optimizer.cpp, elementwise.
#include "kernels/cuda/adamw.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__global__ void adamw_kernel(float* w, float* m, float* v, const float* g, const uint8_t* mask, int64_t n, AdamParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = g[i] * p.grad_scale;
    const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / p.bias_correction1) / (sqrtf(vi / p.bias_correction2) + p.eps);
    const float wd = mask && mask[i] ? p.weight_decay : 0.0f;
    w[i] -= p.lr * (update + wd * w[i]);
  }
}

}  // namespace

void adamw_step(float* w, float* m, float* v, const float* g, const uint8_t* mask, int64_t n, const AdamParams& p, cudaStream_t s) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535 * 4));
  adamw_kernel<<<blocks, 256, 0, s>>>(w, m, v, g, mask, n, p);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
