// stream_delay.cu
#include "kernels/cuda/stream_delay.h"

#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__global__ void delay_kernel(int64_t ns) {
  for (int64_t waited = 0; waited < ns; waited += 1000) __nanosleep(1000);
}

}  // namespace

void stream_delay(int64_t microseconds, cudaStream_t stream) {
  if (microseconds <= 0) return;
  delay_kernel<<<1, 1, 0, stream>>>(microseconds * 1000);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
