// attention_sink.cu: the sink logits' conversion and gradient (kernels/cuda/attention_sink.h).
#include "kernels/cuda/attention_sink.h"
#include "kernels/cuda/bf16_common.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

template <typename T16>
__global__ void to_float(float* out, const T16* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_f(in[i]);
  }
}

constexpr int kThreads = 256;

__global__ void sink_grad(float* sink_grad, const float* sink, const float* stats, const float* row_sums, float sum_scale, int64_t B, int64_t H,
                          int64_t S, int64_t stats_rows) {
  const int64_t h = blockIdx.x;
  const float logit = sink[h];
  float acc = 0.0f;
  for (int64_t r = threadIdx.x; r < B * S; r += kThreads) {
    const int64_t b = r / S, i = r % S;
    const float p_sink = __expf(logit - stats[(b * H + h) * stats_rows + i]);
    acc += p_sink * row_sums[(b * H + h) * S + i] * sum_scale;
  }
  __shared__ float part[kThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (static_cast<int>(threadIdx.x) < step) part[threadIdx.x] += part[threadIdx.x + step];
    __syncthreads();
  }
  if (threadIdx.x == 0) sink_grad[h] -= part[0];
}

}  // namespace

void sink_logits_to_float(float* out, const bf16* logits, int64_t n, cudaStream_t stream, F16 t) {
  if (n == 0) return;
  if (t == F16::kFP16) to_float<<<grid_for(n, 256), 256, 0, stream>>>(out, hp(logits), n);
  else to_float<<<grid_for(n, 256), 256, 0, stream>>>(out, logits, n);
  MT_CUDA_CHECK_LAUNCH();
}

void attention_sink_grad(float* sink_grad_out, const float* sink, const float* stats, const float* row_sums, float sum_scale, int64_t B, int64_t H,
                         int64_t S, int64_t stats_rows, cudaStream_t stream) {
  if (H == 0 || B * S == 0) return;
  sink_grad<<<static_cast<unsigned>(H), kThreads, 0, stream>>>(sink_grad_out, sink, stats, row_sums, sum_scale, B, H, S, stats_rows);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
