// rope.h (CUDA): rotary embedding in place on [T, H, d] (Megatron's rotate-half form), from a cos/sin
// table computed once on the host in double precision (so it agrees with the CPU reference).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/bf16_fwd.h"
#include "kernels/rope_frequencies.h"

namespace mt::cuda {

// Table [max_pos, rot_dim / 2] of cos and sin (interleaved pairs), to upload once.
std::vector<float> rope_table(int64_t max_pos, int64_t rot_dim, double base, const RopeScaling& scaling = {});  // (kernels/rope_frequencies.h)

// sign = +1 forward, -1 backward (the inverse rotation).
// interleaved (--rotary-interleaved): pairs (2i, 2i + 1) instead of (i, i + rot_dim / 2).
void rope_apply(float* x, const int32_t* positions, const float* table, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float sign,
                cudaStream_t stream, bool interleaved = false);
// The same on 16-bit heads of type t (the same rotation as qkv_split_rope, for heads normalised between split
// and RoPE by --qk-layernorm).
void rope_apply_16(bf16* x, const int32_t* positions, const float* table, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float sign,
                   cudaStream_t stream, F16 t = F16::kBF16, bool interleaved = false);

}  // namespace mt::cuda
