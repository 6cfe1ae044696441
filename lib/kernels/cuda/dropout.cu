// dropout.cu: one thread per element, a grid-stride loop.
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/dropout.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__global__ void dropout_rows_kernel(float* x, int64_t rows, int64_t h, RowDropout d) {
  const int64_t n = rows * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= dropout_factor(d, i / h, i % h, h);
  }
}

__global__ void write_seed_kernel(int64_t* dst, uint64_t seed) {
  dst[0] = static_cast<int64_t>(seed);
  dst[2] = 0;
}

}  // namespace

void write_philox_seed(int64_t* dst, uint64_t seed, cudaStream_t stream) {
  write_seed_kernel<<<1, 1, 0, stream>>>(dst, seed);
  MT_CUDA_CHECK_LAUNCH();
}

void dropout_rows_f32(float* x, int64_t rows, int64_t h, const RowDropout& d, cudaStream_t stream) {
  if (!d.on() || rows * h == 0) return;
  dropout_rows_kernel<<<grid_for(rows * h, 256), 256, 0, stream>>>(x, rows, h, d);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
