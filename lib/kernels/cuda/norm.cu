// norm.cu: one block per row, block-wide sums in fp32 (two-level: warp shuffles, then shared memory).
#include "kernels/cuda/norm.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  float t = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
  if (warp == 0) {
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (lane == 0) warp_sums[0] = t;
  }
  __syncthreads();
  const float r = warp_sums[0];
  __syncthreads();
  return r;
}

__global__ void layernorm_fwd_kernel(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int h,
                                     float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * h;
  float s = 0;
  for (int i = threadIdx.x; i < h; i += kThreads) s += xr[i];
  const float m = block_sum(s) / h;
  float v = 0;
  for (int i = threadIdx.x; i < h; i += kThreads) v += (xr[i] - m) * (xr[i] - m);
  const float r = rsqrtf(block_sum(v) / h + eps);
  float* o = out + static_cast<int64_t>(blockIdx.x) * h;
  for (int i = threadIdx.x; i < h; i += kThreads) o[i] = (xr[i] - m) * r * w[i] + (b ? b[i] : 0.0f);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = r;
  }
}

__global__ void layernorm_bwd_dx_kernel(float* dx, const float* dout, const float* x, const float* w, const float* mean,
                                        const float* rstd, int h) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * h;
  const float* g = dout + row * h;
  const float m = mean[row], r = rstd[row];
  float sg = 0, sgx = 0;
  for (int i = threadIdx.x; i < h; i += kThreads) {
    const float gw = g[i] * w[i];
    sg += gw;
    sgx += gw * (xr[i] - m) * r;
  }
  const float mg = block_sum(sg) / h, mgx = block_sum(sgx) / h;
  for (int i = threadIdx.x; i < h; i += kThreads) {
    const float xhat = (xr[i] - m) * r;
    dx[row * h + i] = r * (g[i] * w[i] - mg - xhat * mgx);
  }
}

// Column sums over rows: thread j owns column j; adjacent threads read adjacent addresses.
__global__ void norm_bwd_dw_kernel(float* dw, float* db, const float* dout, const float* x, const float* mean, const float* rstd,
                                   int64_t N, int h) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= h) return;
  float sw = 0, sb = 0;
  for (int64_t n = 0; n < N; ++n) {
    const float g = dout[n * h + j];
    const float xhat = (x[n * h + j] - (mean ? mean[n] : 0.0f)) * rstd[n];
    sw += g * xhat;
    sb += g;
  }
  dw[j] += sw;
  if (db) db[j] += sb;
}

__global__ void rmsnorm_fwd_kernel(float* out, float* rstd, const float* x, const float* w, int h, float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * h;
  float s = 0;
  for (int i = threadIdx.x; i < h; i += kThreads) s += xr[i] * xr[i];
  const float r = rsqrtf(block_sum(s) / h + eps);
  float* o = out + static_cast<int64_t>(blockIdx.x) * h;
  for (int i = threadIdx.x; i < h; i += kThreads) o[i] = xr[i] * r * w[i];
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}

__global__ void rmsnorm_bwd_dx_kernel(float* dx, const float* dout, const float* x, const float* w, const float* rstd, int h) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * h;
  const float* g = dout + row * h;
  const float r = rstd[row];
  float sgx = 0;
  for (int i = threadIdx.x; i < h; i += kThreads) sgx += g[i] * w[i] * xr[i] * r;
  const float mgx = block_sum(sgx) / h;
  for (int i = threadIdx.x; i < h; i += kThreads) dx[row * h + i] = r * (g[i] * w[i] - xr[i] * r * mgx);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N, int64_t h,
                       float eps, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(out, mean, rstd, x, w, b, static_cast<int>(h), eps);
  MT_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w, const float* mean,
                        const float* rstd, int64_t N, int64_t h, cudaStream_t stream) {
  if (N == 0) return;
  layernorm_bwd_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(dx, dout, x, w, mean, rstd, static_cast<int>(h));
  MT_CUDA_CHECK_LAUNCH();
  norm_bwd_dw_kernel<<<static_cast<unsigned>((h + 255) / 256), 256, 0, stream>>>(dw, db, dout, x, mean, rstd, N, static_cast<int>(h));
  MT_CUDA_CHECK_LAUNCH();
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t h, float eps, cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_fwd_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(out, rstd, x, w, static_cast<int>(h), eps);
  MT_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd, int64_t N,
                      int64_t h, cudaStream_t stream) {
  if (N == 0) return;
  rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(N), kThreads, 0, stream>>>(dx, dout, x, w, rstd, static_cast<int>(h));
  MT_CUDA_CHECK_LAUNCH();
  norm_bwd_dw_kernel<<<static_cast<unsigned>((h + 255) / 256), 256, 0, stream>>>(dw, nullptr, dout, x, nullptr, rstd, N,
                                                                                 static_cast<int>(h));
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
