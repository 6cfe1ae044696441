// bf16_fwd.h: the bf16 element type for host headers (the kernels' headers include it; host code passes
// pointers only).
#pragma once
#include <cuda_bf16.h>

namespace mt::cuda {
using bf16 = __nv_bfloat16;
}  // namespace mt::cuda
