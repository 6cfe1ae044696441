// cross_entropy.cu: online max/sum per row in one pass over the logits.
#include <cfloat>

#include "kernels/cuda/cross_entropy.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void ce_fwd(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t V) {
  const int64_t n = blockIdx.x;
  const float* row = logits + n * V;
  // Online softmax normaliser: running max m and sum s of exp(x - m).
  float m = -FLT_MAX, s = 0.0f;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = row[i];
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  __shared__ float sm[kThreads], ss[kThreads];
  sm[threadIdx.x] = m;
  ss[threadIdx.x] = s;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const float m1 = sm[threadIdx.x], m2 = sm[threadIdx.x + stride];
      const float mm = fmaxf(m1, m2);
      ss[threadIdx.x] = ss[threadIdx.x] * expf(m1 - mm) + ss[threadIdx.x + stride] * expf(m2 - mm);
      sm[threadIdx.x] = mm;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float l = sm[0] + logf(ss[0]);
    lse[n] = l;
    losses[n] = l - row[targets[n]];
  }
}

__global__ void ce_bwd(float* d, const float* logits, const float* lse, const int32_t* targets, const float* dloss, int64_t V) {
  const int64_t n = blockIdx.x;
  const float g = dloss[n], l = lse[n];
  const int32_t t = targets[n];
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float p = expf(logits[n * V + i] - l) * g;
    d[n * V + i] = i == t ? p - g : p;
  }
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N, int64_t V,
                           cudaStream_t s) {
  if (N == 0) return;
  ce_fwd<<<static_cast<unsigned>(N), kThreads, 0, s>>>(losses, lse, logits, targets, V);
  MT_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse, const int32_t* targets, const float* dloss,
                            int64_t N, int64_t V, cudaStream_t s) {
  if (N == 0) return;
  ce_bwd<<<static_cast<unsigned>(N), kThreads, 0, s>>>(dlogits, logits, lse, targets, dloss, V);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
