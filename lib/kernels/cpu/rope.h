// rope.h: rotary position embedding on the first rot_dim = rotary_percent * d channels of each head, in place:
// Megatron's default "rotate half" form (channel i with i + rot_dim / 2), or with interleaved pairs (channel 2i with
// 2i + 1: --rotary-interleaved). Backward is the inverse rotation.
#pragma once
#include <cstdint>

#include "kernels/rope_frequencies.h"

namespace mt::cpu {

// x: [T, H, d]; positions: [T]. scaling: LLaMA 3.1's frequency scaling and the linear position interpolation
// (kernels/rope_frequencies.h; the default: neither).
void rope_forward(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved = false,
                  const RopeScaling& scaling = {});
void rope_backward(float* dx, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved = false,
                   const RopeScaling& scaling = {});

}  // namespace mt::cpu
