// device_info_none.cpp: the answer of a build without the CUDA backend.
#include "tensor/device_info.h"

namespace mt {

std::vector<GpuInfo> visible_gpus() { return {}; }
std::string gpu_unavailable_reason() { return "this build has no CUDA backend (nvcc was not found at configure time)"; }
bool built_with_cuda() { return false; }

void set_cuda_device(int) {}

}  // namespace mt
