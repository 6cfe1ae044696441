// sum_parts.cu: see sum_parts.h.
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/sum_parts.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

template <typename T16>
__global__ void sum_parts8(T16* out, const T16* in, int64_t parts, int64_t n8) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Bf16x8 acc = load_bf16x8(in + i * 8);
    for (int64_t p = 1; p < parts; ++p) {
      const Bf16x8 v = load_bf16x8(in + (p * n8 + i) * 8);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc.x[k] += v.x[k];
    }
    store_bf16x8(out + i * 8, acc);
  }
}

template <typename T16>
__global__ void sum_parts1(T16* out, const T16* in, int64_t parts, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = to_f(in[i]);
    for (int64_t p = 1; p < parts; ++p) acc += to_f(in[p * n + i]);
    out[i] = from_f<T16>(acc);
  }
}

template <typename T16>
void sum_parts_t(T16* out, const T16* in, int64_t parts, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 8 == 0 && aligned16(out) && aligned16(in)) {
    sum_parts8<<<grid_for(n / 8, 256), 256, 0, stream>>>(out, in, parts, n / 8);
  } else {
    sum_parts1<<<grid_for(n, 256), 256, 0, stream>>>(out, in, parts, n);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sum_parts_bf16(bf16* out, const bf16* in, int64_t parts, int64_t n, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) sum_parts_t(hp(out), hp(in), parts, n, stream);
  else sum_parts_t(out, in, parts, n, stream);
}

}  // namespace mt::cuda
