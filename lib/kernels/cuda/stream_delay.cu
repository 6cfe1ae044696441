// stream_delay.cu
#include "kernels/cuda/stream_delay.h"

#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__device__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Until the device's global timer has advanced by ns (__nanosleep alone promises no minimum).
__global__ void delay_kernel(int64_t ns) {
  const uint64_t end = global_ns() + static_cast<uint64_t>(ns);
  while (global_ns() < end) __nanosleep(1000);
}

}  // namespace

void stream_delay(int64_t microseconds, cudaStream_t stream) {
  if (microseconds <= 0) return;
  delay_kernel<<<1, 1, 0, stream>>>(microseconds * 1000);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
