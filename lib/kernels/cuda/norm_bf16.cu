// norm_bf16.cu: one block per row forward (values kept in registers between the two passes); the
// backward walks a fixed range of rows per block so each thread owns its columns' weight-gradient partials.
#include <algorithm>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/norm_bf16.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

template <int MAXC>
__global__ void add_norm_fwd_kernel(float* sum_out, bf16* y, float* mean, float* rstd, const float* x, const bf16* delta,
                                    const bf16* w, const bf16* b, int64_t h, float eps, bool rms) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * h;
  const bf16* dr = delta ? delta + row * h : nullptr;
  float v[MAXC];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    v[j] = 0.0f;
    if (c < h) {
      v[j] = xr[c] + (dr ? __bfloat162float(dr[c]) : 0.0f);
      s += v[j];
    }
  }
  const float hf = static_cast<float>(h);
  const float mu = rms ? 0.0f : block_sum(s) / hf;
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (c < h) q += (v[j] - mu) * (v[j] - mu);
  }
  const float r = rsqrtf(block_sum(q) / hf + eps);
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (c < h) {
      if (sum_out) sum_out[row * h + c] = v[j];
      float o = (v[j] - mu) * r * __bfloat162float(w[c]);
      if (b) o += __bfloat162float(b[c]);
      y[row * h + c] = __float2bfloat16(o);
    }
  }
  if (threadIdx.x == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = r;
  }
}

template <int MAXC>
__global__ void norm_bwd_kernel(float* dres, bf16* dres16, float* pw, float* pb, const bf16* dy, const float* x, const float* mean,
                                const float* rstd, const bf16* w, int64_t N, int64_t h, int64_t rows_per_block, bool rms) {
  float aw[MAXC], ab[MAXC], wv[MAXC];
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    aw[j] = ab[j] = 0.0f;
    wv[j] = c < h ? __bfloat162float(w[c]) : 0.0f;
  }
  const int64_t r0 = blockIdx.x * rows_per_block, r1 = min(N, r0 + rows_per_block);
  const float hf = static_cast<float>(h);
  for (int64_t row = r0; row < r1; ++row) {
    const float mu = rms ? 0.0f : mean[row], r = rstd[row];
    float xh[MAXC], g[MAXC];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int j = 0; j < MAXC; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      xh[j] = g[j] = 0.0f;
      if (c < h) {
        const float d = __bfloat162float(dy[row * h + c]);
        xh[j] = (x[row * h + c] - mu) * r;
        g[j] = d * wv[j];
        aw[j] += d * xh[j];
        ab[j] += d;
        sg += g[j];
        sgx += g[j] * xh[j];
      }
    }
    const float mg = rms ? 0.0f : block_sum(sg) / hf;
    const float mgx = block_sum(sgx) / hf;
#pragma unroll
    for (int j = 0; j < MAXC; ++j) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
      if (c < h) {
        const float dx = r * (g[j] - mg - xh[j] * mgx);
        const float t = dres[row * h + c] + dx;
        dres[row * h + c] = t;
        dres16[row * h + c] = __float2bfloat16(t);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (c < h) {
      pw[blockIdx.x * h + c] = aw[j];
      if (pb) pb[blockIdx.x * h + c] = ab[j];
    }
  }
}

__global__ void column_sum_kernel(float* out, const float* partials, int64_t blocks, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  float s = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) s += partials[b * h + c];
  out[c] += s;
}

int cols_per_thread(int64_t h) {
  const int64_t c = (h + kThreads - 1) / kThreads;
  if (c <= 4) return 4;
  if (c <= 8) return 8;
  if (c <= 16) return 16;
  if (c <= 32) return 32;
  return -1;
}

}  // namespace

void add_norm_forward(float* sum_out, bf16* y, float* mean, float* rstd, const float* x, const bf16* delta, const bf16* w,
                      const bf16* b, int64_t N, int64_t h, float eps, bool rms, cudaStream_t stream) {
  if (N == 0) return;
  const dim3 grid(static_cast<unsigned>(N));
  switch (cols_per_thread(h)) {
    case 4: add_norm_fwd_kernel<4><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms); break;
    case 8: add_norm_fwd_kernel<8><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms); break;
    case 16: add_norm_fwd_kernel<16><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms); break;
    case 32: add_norm_fwd_kernel<32><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms); break;
    default: throw std::runtime_error("the CUDA norm kernels support hidden sizes up to 8192");
  }
  MT_CUDA_CHECK_LAUNCH();
}

void norm_backward_add(float* dres, bf16* dres16, float* dw, float* db, const bf16* dy, const float* x, const float* mean,
                       const float* rstd, const bf16* w, int64_t N, int64_t h, bool rms, cudaStream_t stream) {
  if (N == 0) return;
  const int64_t blocks = std::min<int64_t>(N, 1024);
  const int64_t rpb = (N + blocks - 1) / blocks;
  const int64_t nb = (N + rpb - 1) / rpb;
  auto& alloc = DeviceAllocator::instance();
  const size_t bytes = static_cast<size_t>(nb * h) * sizeof(float);
  float* pw = static_cast<float*>(alloc.allocate(bytes));
  float* pb = db ? static_cast<float*>(alloc.allocate(bytes)) : nullptr;
  const dim3 grid(static_cast<unsigned>(nb));
  switch (cols_per_thread(h)) {
    case 4: norm_bwd_kernel<4><<<grid, kThreads, 0, stream>>>(dres, dres16, pw, pb, dy, x, mean, rstd, w, N, h, rpb, rms); break;
    case 8: norm_bwd_kernel<8><<<grid, kThreads, 0, stream>>>(dres, dres16, pw, pb, dy, x, mean, rstd, w, N, h, rpb, rms); break;
    case 16: norm_bwd_kernel<16><<<grid, kThreads, 0, stream>>>(dres, dres16, pw, pb, dy, x, mean, rstd, w, N, h, rpb, rms); break;
    case 32: norm_bwd_kernel<32><<<grid, kThreads, 0, stream>>>(dres, dres16, pw, pb, dy, x, mean, rstd, w, N, h, rpb, rms); break;
    default: throw std::runtime_error("the CUDA norm kernels support hidden sizes up to 8192");
  }
  MT_CUDA_CHECK_LAUNCH();
  column_sum_kernel<<<grid_for(h, 256), 256, 0, stream>>>(dw, pw, nb, h);
  MT_CUDA_CHECK_LAUNCH();
  if (db) {
    column_sum_kernel<<<grid_for(h, 256), 256, 0, stream>>>(db, pb, nb, h);
    MT_CUDA_CHECK_LAUNCH();
  }
  alloc.release(pw);
  if (pb) alloc.release(pb);
}

}  // namespace mt::cuda
