// norm_bf16.cu: one block per row for the forward and the input gradient (the row stays in registers
// between the two passes; 16-byte loads where the row allows). The weight gradients: where the row takes one or two
// 16-byte runs per thread, in the input gradient's kernel (its blocks walk rows and keep per-column sums), else in
// a second, column-parallel kernel over row ranges; either way per-block partials, then a fixed-order sum.
#include <algorithm>
#include <atomic>
#include <initializer_list>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/dropout.cuh"
#include "kernels/cuda/norm_bf16.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt::cuda {
namespace {

constexpr int kThreads = 256;

// R: the residual stream's type (float, or the run's 16-bit type T16). A 16-bit stream is normalised as
// stored: the sum is rounded before the statistics, so the backward (which reads it back) sees the same input.
template <typename R>
__device__ __forceinline__ float as_stored(float v) {
  return to_f(from_f<R>(v));
}
template <>
__device__ __forceinline__ float as_stored<float>(float v) {
  return v;
}

// p[0] summed with its partial blocks (Partials), the sum rounded to T16 when there is more than one.
template <typename T16>
__device__ __forceinline__ float part_sum(const T16* p, const Partials& parts) {
  float v = to_f(p[0]);
  for (int k = 1; k < parts.count; ++k) v += to_f(p[k * parts.stride]);
  return parts.count > 1 ? as_stored<T16>(v) : v;
}

template <int MAXC, typename T16, typename R>
__global__ void add_norm_fwd_kernel(R* sum_out, T16* y, float* mean, float* rstd, const R* x, const T16* delta, const T16* w, const T16* b,
                                    int64_t h, float eps, bool rms, float w_off, RowDropout drop, Partials parts) {
  const int64_t row = blockIdx.x;
  const R* xr = x + row * h;
  const T16* dr = delta ? delta + row * h : nullptr;
  float v[MAXC];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    v[j] = 0.0f;
    if (c < h) {
      const float dv = dr ? part_sum(dr + c, parts) * (drop.on() ? dropout_factor(drop, row, c, h) : 1.0f) : 0.0f;
      v[j] = as_stored<R>(to_f(xr[c]) + dv);
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
      if (sum_out) sum_out[row * h + c] = from_f<R>(v[j]);
      float o = (v[j] - mu) * r * (to_f(w[c]) + w_off);
      if (b) o += to_f(b[c]);
      y[row * h + c] = from_f<T16>(o);
    }
  }
  if (threadIdx.x == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = r;
  }
}

// Input gradient: one block per row, like the forward (the row in registers between the two passes).
template <int MAXC, typename T16, typename R>
__global__ void norm_bwd_dx_kernel(float* dres, T16* dres16, const T16* dy, const R* x, const float* mean, const float* rstd,
                                   const T16* w, int64_t h, bool rms, float w_off, RowDropout drop, Partials parts) {
  const int64_t row = blockIdx.x;
  const float mu = rms ? 0.0f : mean[row], r = rstd[row];
  float xh[MAXC], g[MAXC];
  float sg = 0.0f, sgx = 0.0f;
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    xh[j] = g[j] = 0.0f;
    if (c < h) {
      xh[j] = (to_f(x[row * h + c]) - mu) * r;
      g[j] = part_sum(dy + row * h + c, parts) * (to_f(w[c]) + w_off);
      sg += g[j];
      sgx += g[j] * xh[j];
    }
  }
  const float hf = static_cast<float>(h);
  const float mg = rms ? 0.0f : block_sum(sg) / hf;
  const float mgx = block_sum(sgx) / hf;
#pragma unroll
  for (int j = 0; j < MAXC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * kThreads;
    if (c < h) {
      const float t = dres[row * h + c] + r * (g[j] - mg - xh[j] * mgx);
      dres[row * h + c] = t;
      dres16[row * h + c] = from_f<T16>(drop.on() ? t * dropout_factor(drop, row, c, h) : t);
    }
  }
}

// Vectorised forms (h a multiple of 8, rows 16-byte aligned): each thread moves runs of 8 consecutive
// columns with 16-byte loads and stores (one for 16-bit data, two for fp32), VPT runs per thread, blockDim.x
// threads (a multiple of 32) per row.
__device__ __forceinline__ void load8(const float* p, float (&o)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
template <typename T16>
__device__ __forceinline__ void load8(const T16* p, float (&o)[8]) {
  const Bf16x8 v = load_bf16x8(p);
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = v.x[k];
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
template <typename T16>
__device__ __forceinline__ void store8(T16* p, const float (&v)[8]) {
  Bf16x8 o;
#pragma unroll
  for (int k = 0; k < 8; ++k) o.x[k] = v[k];
  store_bf16x8(p, o);
}

// load8 of p and its partial blocks, summed (rounded to T16 when there is more than one; see Partials).
template <typename T16>
__device__ __forceinline__ void load8_parts(const T16* p, const Partials& parts, float (&o)[8]) {
  load8(p, o);
  if (parts.count == 1) return;
  for (int j = 1; j < parts.count; ++j) {
    float e[8];
    load8(p + j * parts.stride, e);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] += e[k];
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = as_stored<T16>(o[k]);
}

template <int VPT, typename T16, typename R>
__global__ void add_norm_fwd_vec(R* sum_out, T16* y, float* mean, float* rstd, const R* x, const T16* delta, const T16* w, const T16* b,
                                 int64_t h, float eps, bool rms, float w_off, RowDropout drop, Partials parts) {
  const int64_t row = blockIdx.x, nv = h / 8;
  float v[VPT][8];
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t c = (threadIdx.x + static_cast<int64_t>(j) * blockDim.x) * 8;
#pragma unroll
    for (int k = 0; k < 8; ++k) v[j][k] = 0.0f;
    if (c < h) {
      float d[8] = {};
      load8(x + row * h + c, v[j]);
      if (delta) load8_parts(delta + row * h + c, parts, d);
      if (delta && drop.on()) {
#pragma unroll
        for (int k = 0; k < 8; ++k) d[k] *= dropout_factor(drop, row, c + k, h);
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[j][k] = as_stored<R>(v[j][k] + d[k]);
        s += v[j][k];
      }
    }
  }
  const float hf = static_cast<float>(h);
  const float mu = rms ? 0.0f : block_sum(s) / hf;
  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if ((threadIdx.x + static_cast<int64_t>(j) * blockDim.x) < nv) {
#pragma unroll
      for (int k = 0; k < 8; ++k) q += (v[j][k] - mu) * (v[j][k] - mu);
    }
  }
  const float r = rsqrtf(block_sum(q) / hf + eps);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int64_t c = (threadIdx.x + static_cast<int64_t>(j) * blockDim.x) * 8;
    if (c < h) {
      if (sum_out) store8(sum_out + row * h + c, v[j]);
      float wv[8], bv[8] = {}, o[8];
      load8(w + c, wv);
      for (float& e : wv) e += w_off;
      if (b) load8(b + c, bv);
#pragma unroll
      for (int k = 0; k < 8; ++k) o[k] = (v[j][k] - mu) * r * wv[k] + bv[k];
      store8(y + row * h + c, o);
    }
  }
  if (threadIdx.x == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = r;
  }
}

// The input gradient of rows blockIdx.x, blockIdx.x + gridDim.x, ...; with kWeights also the weight (and bias,
// pb not null) gradients' partial sums of those rows, in row order, into row blockIdx.x of pw (pb): the rows
// are read once for both (the separate weight-gradient pass reads dy and x again).
template <int VPT, bool kWeights, typename T16, typename R>
__global__ void norm_bwd_dx_vec(float* dres, T16* dres16, const T16* dy, const R* x, const float* mean, const float* rstd, const T16* w,
                                int64_t N, int64_t h, bool rms, float w_off, RowDropout drop, Partials parts, float* pw, float* pb) {
  constexpr int kAcc = kWeights ? VPT : 1;
  float aw[kAcc][8] = {}, ab[kAcc][8] = {};
  const float hf = static_cast<float>(h);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float mu = rms ? 0.0f : mean[row], r = rstd[row];
    float xh[VPT][8], g[VPT][8];
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = (threadIdx.x + static_cast<int64_t>(j) * blockDim.x) * 8;
#pragma unroll
      for (int k = 0; k < 8; ++k) xh[j][k] = g[j][k] = 0.0f;
      if (c < h) {
        float wv[8];
        load8(x + row * h + c, xh[j]);
        load8_parts(dy + row * h + c, parts, g[j]);
        load8(w + c, wv);
        for (float& e : wv) e += w_off;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          xh[j][k] = (xh[j][k] - mu) * r;
          if constexpr (kWeights) {
            aw[j][k] += g[j][k] * xh[j][k];
            ab[j][k] += g[j][k];
          }
          g[j][k] *= wv[k];
          sg += g[j][k];
          sgx += g[j][k] * xh[j][k];
        }
      }
    }
    const float mg = rms ? 0.0f : block_sum(sg) / hf;
    const float mgx = block_sum(sgx) / hf;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = (threadIdx.x + static_cast<int64_t>(j) * blockDim.x) * 8;
      if (c < h) {
        float t[8];
        load8(dres + row * h + c, t);
#pragma unroll
        for (int k = 0; k < 8; ++k) t[k] += r * (g[j][k] - mg - xh[j][k] * mgx);
        store8(dres + row * h + c, t);
        if (drop.on()) {
#pragma unroll
          for (int k = 0; k < 8; ++k) t[k] *= dropout_factor(drop, row, c + k, h);
        }
        store8(dres16 + row * h + c, t);
      }
    }
  }
  if constexpr (kWeights) {
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int64_t c = (threadIdx.x + static_cast<int64_t>(j) * blockDim.x) * 8;
      if (c < h) {
        store8(pw + blockIdx.x * h + c, aw[j]);
        if (pb) store8(pb + blockIdx.x * h + c, ab[j]);
      }
    }
  }
}

// The vectorised kernels' shape for a row of h: threads (a multiple of 32, at most 256) and runs per thread
// (0: not vectorisable).
struct VecShape {
  int threads = 0, vpt = 0;
};
VecShape vec_shape(int64_t h, std::initializer_list<const void*> ptrs, const Partials& parts) {
  if (h % 8 != 0 || h > 8192 || (parts.count > 1 && parts.stride % 8 != 0)) return {};
  for (const void* p : ptrs) {
    if (p && !aligned16(p)) return {};
  }
  const int64_t nv = h / 8;
  const int threads = static_cast<int>(std::min<int64_t>(256, (nv + 31) / 32 * 32));
  const int64_t vpt = (nv + threads - 1) / threads;
  return {threads, vpt <= 1 ? 1 : vpt <= 2 ? 2 : 4};
}

// Weight (and bias) gradient partials: blocks own a column tile and a range of rows, threads a column.
template <typename T16, typename R>
__global__ void norm_bwd_dw_kernel(float* pw, float* pb, const T16* dy, const R* x, const float* mean, const float* rstd, int64_t N,
                                   int64_t h, int64_t rows_per_block, bool rms, Partials parts) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  const int64_t r0 = blockIdx.y * rows_per_block, r1 = min(N, r0 + rows_per_block);
  float aw = 0.0f, ab = 0.0f;
  for (int64_t row = r0; row < r1; ++row) {
    const float d = part_sum(dy + row * h + c, parts);
    aw += d * (to_f(x[row * h + c]) - (rms ? 0.0f : mean[row])) * rstd[row];
    ab += d;
  }
  pw[blockIdx.y * h + c] = aw;
  if (pb) pb[blockIdx.y * h + c] = ab;
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

template <typename T16, typename R>
void add_norm_forward_t(R* sum_out, T16* y, float* mean, float* rstd, const R* x, const T16* delta, const T16* w, const T16* b, int64_t N,
                        int64_t h, float eps, bool rms, float w_off, cudaStream_t stream, const RowDropout& drop, const Partials& parts) {
  if (N == 0) return;
  const dim3 grid(static_cast<unsigned>(N));
  const VecShape vs = vec_shape(h, {sum_out, y, x, delta, w, b}, parts);
  if (vs.vpt) {
    switch (vs.vpt) {
      case 1: add_norm_fwd_vec<1><<<grid, vs.threads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
      case 2: add_norm_fwd_vec<2><<<grid, vs.threads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
      default: add_norm_fwd_vec<4><<<grid, vs.threads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
    }
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  switch (cols_per_thread(h)) {
    case 4: add_norm_fwd_kernel<4><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
    case 8: add_norm_fwd_kernel<8><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
    case 16: add_norm_fwd_kernel<16><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
    case 32: add_norm_fwd_kernel<32><<<grid, kThreads, 0, stream>>>(sum_out, y, mean, rstd, x, delta, w, b, h, eps, rms, w_off, drop, parts); break;
    default: throw std::runtime_error("the CUDA norm kernels support hidden sizes up to 8192");
  }
  MT_CUDA_CHECK_LAUNCH();
}

constexpr int64_t kMaxRowBlocks = 256;  // the weight-gradient pass's row ranges (partial sums per column)
// The input-gradient kernel that sums the weight gradients too (rows of up to 2 runs of 8 per thread: more would
// hold too many accumulators in registers): as many blocks as fit on the GPU at once, at most this many.
constexpr int64_t kMaxFusedBlocks = 2048;

int sm_count() {
  static const int n = [] {
    int device = 0, count = 0;
    MT_CUDA_CHECK(cudaGetDevice(&device));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }();
  return n;
}

// The fused kernel's blocks for N rows: as many as fit on the GPU at once (the occupancy of its bf16 form, queried once
// per shape), at least one row each, at most kMaxFusedBlocks.
int64_t fused_blocks(int vpt, int threads, int64_t N) {
  static std::atomic<int> per_sm[3][257] = {};  // [vpt][threads]: 0 until asked (a race asks twice, for the same answer)
  int n = per_sm[vpt][threads].load(std::memory_order_relaxed);
  if (n == 0) {
    const void* kernel = vpt == 1 ? reinterpret_cast<const void*>(norm_bwd_dx_vec<1, true, bf16, bf16>)
                                  : reinterpret_cast<const void*>(norm_bwd_dx_vec<2, true, bf16, bf16>);
    MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0));
    n = std::max(n, 1);
    per_sm[vpt][threads].store(n, std::memory_order_relaxed);
  }
  return std::clamp<int64_t>(static_cast<int64_t>(n) * sm_count(), 1, std::min(N, kMaxFusedBlocks));
}

template <int VPT, typename T16, typename R>
int64_t launch_fused_dx(float* dres, T16* dres16, const T16* dy, const R* x, const float* mean, const float* rstd, const T16* w, int64_t N,
                        int64_t h, bool rms, float w_off, const RowDropout& drop, const Partials& parts, int threads, float* pw, float* pb, cudaStream_t stream) {
  const int64_t nb = fused_blocks(VPT, threads, N);
  norm_bwd_dx_vec<VPT, true><<<static_cast<unsigned>(nb), threads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, N, h, rms, w_off, drop, parts, pw, pb);
  MT_CUDA_CHECK_LAUNCH();
  return nb;
}

template <typename T16, typename R>
void norm_backward_add_t(float* dres, T16* dres16, float* dw, float* db, const T16* dy, const R* x, const float* mean, const float* rstd,
                         const T16* w, int64_t N, int64_t h, bool rms, float w_off, cudaStream_t stream, const RowDropout& drop, float* scratch,
                         const Partials& parts) {
  if (N == 0) return;
  const dim3 rows(static_cast<unsigned>(N));
  const VecShape vs = vec_shape(h, {dres, dres16, dy, x, w}, parts);
  const bool fused = vs.vpt == 1 || vs.vpt == 2;
  const int64_t row_blocks = std::min<int64_t>(N, kMaxRowBlocks);
  const int64_t rpb = (N + row_blocks - 1) / row_blocks;
  const int64_t max_blocks = fused ? fused_blocks(vs.vpt, vs.threads, N) : (N + rpb - 1) / rpb;
  auto& alloc = DeviceAllocator::instance();
  const size_t bytes = static_cast<size_t>(max_blocks * h) * sizeof(float);
  float* pw = scratch ? scratch : static_cast<float*>(alloc.allocate(bytes));
  float* pb = db ? (scratch ? scratch + max_blocks * h : static_cast<float*>(alloc.allocate(bytes))) : nullptr;
  int64_t nb = 0;  // the partials' rows
  if (vs.vpt == 1) {
    nb = launch_fused_dx<1>(dres, dres16, dy, x, mean, rstd, w, N, h, rms, w_off, drop, parts, vs.threads, pw, pb, stream);
  } else if (vs.vpt == 2) {
    nb = launch_fused_dx<2>(dres, dres16, dy, x, mean, rstd, w, N, h, rms, w_off, drop, parts, vs.threads, pw, pb, stream);
  } else if (vs.vpt == 4) {
    norm_bwd_dx_vec<4, false><<<rows, vs.threads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, N, h, rms, w_off, drop, parts, nullptr, nullptr);
  } else {
    switch (cols_per_thread(h)) {
      case 4: norm_bwd_dx_kernel<4><<<rows, kThreads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, h, rms, w_off, drop, parts); break;
      case 8: norm_bwd_dx_kernel<8><<<rows, kThreads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, h, rms, w_off, drop, parts); break;
      case 16: norm_bwd_dx_kernel<16><<<rows, kThreads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, h, rms, w_off, drop, parts); break;
      case 32: norm_bwd_dx_kernel<32><<<rows, kThreads, 0, stream>>>(dres, dres16, dy, x, mean, rstd, w, h, rms, w_off, drop, parts); break;
      default: throw std::runtime_error("the CUDA norm kernels support hidden sizes up to 8192");
    }
  }
  MT_CUDA_CHECK_LAUNCH();
  if (!fused) {  // the weight gradients in a second pass over dy and x
    nb = (N + rpb - 1) / rpb;
    const dim3 grid(static_cast<unsigned>((h + 255) / 256), static_cast<unsigned>(nb));
    norm_bwd_dw_kernel<<<grid, 256, 0, stream>>>(pw, pb, dy, x, mean, rstd, N, h, rpb, rms, parts);
    MT_CUDA_CHECK_LAUNCH();
  }
  add_column_sums_kernel<<<grid_for(h, 256), 256, 0, stream>>>(dw, pw, nb, h);
  MT_CUDA_CHECK_LAUNCH();
  if (db) {
    add_column_sums_kernel<<<grid_for(h, 256), 256, 0, stream>>>(db, pb, nb, h);
    MT_CUDA_CHECK_LAUNCH();
  }
  if (!scratch) {
    alloc.release(pw);
    if (pb) alloc.release(pb);
  }
}

int64_t norm_backward_partials(int64_t h) {
  const VecShape vs = vec_shape(h, {}, Partials{});  // (a call whose pointers do not allow it takes the second pass: fewer blocks)
  const bool may_fuse = vs.vpt == 1 || vs.vpt == 2;
  return 2 * std::max(may_fuse ? fused_blocks(vs.vpt, vs.threads, kMaxFusedBlocks) : 0, kMaxRowBlocks) * h;
}

void add_norm_forward(const AddNorm& a, cudaStream_t stream) {
  const RowDropout drop = a.dropout ? *a.dropout : RowDropout{};
  auto* so = static_cast<float*>(a.sum_out);
  const auto* xf = static_cast<const float*>(a.x);
  auto* so16 = static_cast<bf16*>(a.sum_out);
  const auto* x16 = static_cast<const bf16*>(a.x);
  const int64_t N = a.rows, h = a.width;
  if (a.type == F16::kFP16) {
    if (a.res16)
      add_norm_forward_t(hp(so16), hp(a.y), a.mean, a.rstd, hp(x16), hp(a.delta), hp(a.w), hp(a.b), N, h, a.eps, a.rms, a.w_offset, stream, drop, a.parts);
    else add_norm_forward_t(so, hp(a.y), a.mean, a.rstd, xf, hp(a.delta), hp(a.w), hp(a.b), N, h, a.eps, a.rms, a.w_offset, stream, drop, a.parts);
  } else {
    if (a.res16) add_norm_forward_t(so16, a.y, a.mean, a.rstd, x16, a.delta, a.w, a.b, N, h, a.eps, a.rms, a.w_offset, stream, drop, a.parts);
    else add_norm_forward_t(so, a.y, a.mean, a.rstd, xf, a.delta, a.w, a.b, N, h, a.eps, a.rms, a.w_offset, stream, drop, a.parts);
  }
}

void norm_backward_add(const NormBackward& a, cudaStream_t stream) {
  const RowDropout drop = a.dropout ? *a.dropout : RowDropout{};
  const auto* xf = static_cast<const float*>(a.x);
  const auto* x16 = static_cast<const bf16*>(a.x);
  const int64_t N = a.rows, h = a.width;
  if (a.type == F16::kFP16) {
    if (a.res16)
      norm_backward_add_t(a.dres, hp(a.dres16), a.dw, a.db, hp(a.dy), hp(x16), a.mean, a.rstd, hp(a.w), N, h, a.rms, a.w_offset, stream, drop, a.partials,
                          a.parts);
    else norm_backward_add_t(a.dres, hp(a.dres16), a.dw, a.db, hp(a.dy), xf, a.mean, a.rstd, hp(a.w), N, h, a.rms, a.w_offset, stream, drop, a.partials, a.parts);
  } else {
    if (a.res16) norm_backward_add_t(a.dres, a.dres16, a.dw, a.db, a.dy, x16, a.mean, a.rstd, a.w, N, h, a.rms, a.w_offset, stream, drop, a.partials, a.parts);
    else norm_backward_add_t(a.dres, a.dres16, a.dw, a.db, a.dy, xf, a.mean, a.rstd, a.w, N, h, a.rms, a.w_offset, stream, drop, a.partials, a.parts);
  }
}

}  // namespace mt::cuda
