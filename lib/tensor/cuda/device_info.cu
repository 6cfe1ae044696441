// device_info.cu: GPU discovery through the CUDA runtime; every call checked.
#include <cuda_runtime.h>

#include "tensor/device_info.h"
#include "tensor/cuda/cuda_check.h"

namespace mt {

std::vector<GpuInfo> visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return {};
  }
  std::vector<GpuInfo> out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.memory_bytes = p.totalGlobalMem;
    g.major = p.major;
    g.minor = p.minor;
    g.sm_count = p.multiProcessorCount;
    out.push_back(g);
  }
  return out;
}

std::string gpu_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable GPU: ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no GPU is visible (CUDA_VISIBLE_DEVICES?)" : "";
}

bool built_with_cuda() { return true; }

void set_cuda_device(int index) { MT_CUDA_CHECK(cudaSetDevice(index)); }

}  // namespace mt
