// activation.cu: grid-stride elementwise kernels.
#include "kernels/cuda/activation.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

__global__ void gelu_fwd(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

__global__ void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float t = tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v));
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * dinner);
  }
}

__global__ void swiglu_fwd(float* y, const float* x, int64_t N, int64_t F) {
  const int64_t total = N * F;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = k / F, i = k % F;
    const float g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
    y[k] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void swiglu_bwd(float* dx, const float* dy, const float* x, int64_t N, int64_t F) {
  const int64_t total = N * F;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = k / F, i = k % F;
    const float g = x[n * 2 * F + i], u = x[n * 2 * F + F + i];
    const float s = 1.0f / (1.0f + expf(-g));
    dx[n * 2 * F + F + i] = dy[k] * g * s;
    dx[n * 2 * F + i] = dy[k] * u * (s * (1.0f + g * (1.0f - s)));
  }
}

}  // namespace

void gelu_forward(float* y, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_fwd<<<blocks_for(n), 256, 0, s>>>(y, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_bwd<<<blocks_for(n), 256, 0, s>>>(dx, dy, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void swiglu_forward(float* y, const float* x, int64_t N, int64_t F, cudaStream_t s) {
  if (N * F == 0) return;
  swiglu_fwd<<<blocks_for(N * F), 256, 0, s>>>(y, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}
void swiglu_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t F, cudaStream_t s) {
  if (N * F == 0) return;
  swiglu_bwd<<<blocks_for(N * F), 256, 0, s>>>(dx, dy, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
