// rope.h: rotary position embedding on the first rot_dim = rotary_percent * d channels of each head, in place:
// Megatron's default "rotate half" form (channel i with i + rot_dim / 2), or with interleaved pairs (channel 2i with
// 2i + 1: --rotary-interleaved). Backward is the inverse rotation.
#pragma once
#include <cstdint>

namespace mt::cpu {

// x: [T, H, d]; positions: [T]. scaling: LLaMA 3.1's frequency scaling factor (--rope-scaling-factor; 0: none), see
// kernels/rope_frequencies.h.
void rope_forward(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved = false,
                  float scaling = 0);
void rope_backward(float* dx, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base, bool interleaved = false,
                   float scaling = 0);

}  // namespace mt::cpu
