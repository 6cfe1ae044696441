// bf16_fwd.h: the 16-bit element types for host headers (the kernels' headers include it; host code passes
// pointers only). A run computes in bf16 (--bf16) or fp16 (--fp16): the 16-bit launchers take that type as
// their last argument (F16, bf16 when left out) and read their buffers, typed bf16* as storage of 16 bits,
// as that type; the model's buffers hold the run's type throughout.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mt::cuda {
using bf16 = __nv_bfloat16;
enum class F16 : uint8_t { kBF16, kFP16 };
}  // namespace mt::cuda
