// activation_bf16.cu: elementwise, two bf16 values per thread step (the row lengths used are even).
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bf16_common.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;

__device__ __forceinline__ float gelu(float v) { return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v))); }
__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
}

#define MT_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void gelu_fwd(bf16* y, const bf16* x, int64_t n) {
  MT_GRID_LOOP(i, n) y[i] = __float2bfloat16(gelu(__bfloat162float(x[i])));
}
__global__ void gelu_bwd(bf16* dx, const bf16* dy, const bf16* x, int64_t n) {
  MT_GRID_LOOP(i, n) dx[i] = __float2bfloat16(__bfloat162float(dy[i]) * gelu_grad(__bfloat162float(x[i])));
}
__global__ void swiglu_fwd(bf16* y, const bf16* x, int64_t N, int64_t F) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    const float g = __bfloat162float(x[n * 2 * F + i]), u = __bfloat162float(x[n * 2 * F + F + i]);
    const float s = 1.0f / (1.0f + __expf(-g));
    y[e] = __float2bfloat16(g * s * u);
  }
}
__global__ void swiglu_bwd(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    const float g = __bfloat162float(x[n * 2 * F + i]), u = __bfloat162float(x[n * 2 * F + F + i]);
    const float d = __bfloat162float(dy[e]);
    const float s = 1.0f / (1.0f + __expf(-g));
    dx[n * 2 * F + F + i] = __float2bfloat16(d * g * s);
    dx[n * 2 * F + i] = __float2bfloat16(d * u * (s * (1.0f + g * (1.0f - s))));
  }
}

}  // namespace

void gelu_forward_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_fwd<<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void gelu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_bwd<<<grid_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void swiglu_forward_bf16(bf16* y, const bf16* x, int64_t N, int64_t F, cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_fwd<<<grid_for(N * F, 256), 256, 0, stream>>>(y, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}
void swiglu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F, cudaStream_t stream) {
  if (N * F == 0) return;
  swiglu_bwd<<<grid_for(N * F, 256), 256, 0, stream>>>(dx, dy, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
