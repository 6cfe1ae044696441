// bias_grad.cu: blocks own row ranges and a column tile; threads own columns.
#include <algorithm>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/bias_grad.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt::cuda {
namespace {

template <typename T16>
__global__ void partial_kernel(float* partials, const T16* dy, int64_t N, int64_t n, int64_t rows_per_block) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= n) return;
  const int64_t r0 = blockIdx.y * rows_per_block, r1 = min(N, r0 + rows_per_block);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += to_f(dy[r * n + c]);
  partials[blockIdx.y * n + c] = s;
}

// Eight columns per thread with 16-byte loads (n % 8 == 0, rows 16-byte aligned).
template <typename T16>
__global__ void partial8_kernel(float* partials, const T16* dy, int64_t N, int64_t n, int64_t rows_per_block) {
  const int64_t c8 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c8 * 8 >= n) return;
  const int64_t r0 = blockIdx.y * rows_per_block, r1 = min(N, r0 + rows_per_block);
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t r = r0; r < r1; ++r) {
    const uint4 u = *reinterpret_cast<const uint4*>(dy + r * n + c8 * 8);
    const T16* e = reinterpret_cast<const T16*>(&u);
#pragma unroll
    for (int k = 0; k < 8; ++k) s[k] += to_f(e[k]);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partials[blockIdx.y * n + c8 * 8 + k] = s[k];
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

}  // namespace

template <typename T16>
void bias_grad_bf16_t(float* db, const T16* dy, int64_t N, int64_t n, cudaStream_t stream) {
  if (N == 0 || n == 0) return;
  const int64_t row_blocks = std::min<int64_t>(N, 256);
  const int64_t rpb = (N + row_blocks - 1) / row_blocks, nb = (N + rpb - 1) / rpb;
  auto& alloc = DeviceAllocator::instance();
  float* partials = static_cast<float*>(alloc.allocate(static_cast<size_t>(nb * n) * sizeof(float)));
  if (n % 8 == 0 && (reinterpret_cast<uintptr_t>(dy) & 15) == 0) {
    const dim3 grid(static_cast<unsigned>((n / 8 + 127) / 128), static_cast<unsigned>(nb));
    partial8_kernel<<<grid, 128, 0, stream>>>(partials, dy, N, n, rpb);
  } else {
    const dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(nb));
    partial_kernel<<<grid, 256, 0, stream>>>(partials, dy, N, n, rpb);
  }
  MT_CUDA_CHECK_LAUNCH();
  add_column_sums_kernel<<<grid_for(n, 256), 256, 0, stream>>>(db, partials, nb, n);
  MT_CUDA_CHECK_LAUNCH();
  alloc.release(partials);
}

void add_f32(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
  MT_CUDA_CHECK_LAUNCH();
}

void bias_grad_bf16(float* db, const bf16* dy, int64_t N, int64_t n, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) bias_grad_bf16_t(db, hp(dy), N, n, stream);
  else bias_grad_bf16_t(db, dy, N, n, stream);
}

}  // namespace mt::cuda
