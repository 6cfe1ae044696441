// document_bias.cu: one block per query row of the bias, each thread writing runs of 8 columns with 16-byte stores.
#include "kernels/cuda/document_bias.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

template <typename T16>
struct Lowest;
template <>
struct Lowest<__nv_bfloat16> {
  // -1.0e30: far below any score, yet finite after cuDNN's scaling (the type's lowest, -3.39e38, would reach -inf
  // once multiplied by log2(e), and a key tile masked whole would then meet -inf - -inf in the running maximum).
  static __device__ __nv_bfloat16 value() { return __ushort_as_bfloat16(0xF14Au); }
};
template <>
struct Lowest<__half> {
  static __device__ __half value() { return __ushort_as_half(0xFBFFu); }  // -65504
};

template <typename T16>
__global__ void document_bias_kernel(T16* bias, const int32_t* row_start, int64_t S) {
  const int64_t row = blockIdx.x;  // (sample, query) = (row / S, row % S)
  const int64_t first = row_start[row];
  const T16 zero = static_cast<T16>(0.0f), low = Lowest<T16>::value();
  T16* out = bias + row * S;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * 8; c < S; c += static_cast<int64_t>(blockDim.x) * 8) {
    alignas(16) T16 v[8];
    for (int k = 0; k < 8; ++k) v[k] = c + k < first ? low : zero;
    *reinterpret_cast<uint4*>(out + c) = *reinterpret_cast<const uint4*>(v);
  }
}

}  // namespace

void document_bias(bf16* bias, const int32_t* row_start, int64_t B, int64_t S, cudaStream_t stream, F16 type) {
  if (B <= 0 || S <= 0) return;
  if (S % 8 != 0) throw std::logic_error("document_bias: the sequence length must be a multiple of 8 (it is " + std::to_string(S) + ")");
  const int threads = static_cast<int>(std::min<int64_t>(256, (S / 8 + 31) / 32 * 32));
  const auto grid = static_cast<unsigned>(B * S);
  if (type == F16::kFP16) document_bias_kernel<<<grid, threads, 0, stream>>>(reinterpret_cast<__half*>(bias), row_start, S);
  else document_bias_kernel<<<grid, threads, 0, stream>>>(bias, row_start, S);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
