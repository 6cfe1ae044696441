// rope.h: rotary position embedding (Megatron's non-interleaved "rotate half" form) on the first
// rot_dim = rotary_percent * d channels of each head, in place. Backward is the inverse rotation.
#pragma once
#include <cstdint>

namespace mt::cpu {

// x: [T, H, d]; positions: [T].
void rope_forward(float* x, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base);
void rope_backward(float* dx, const int32_t* positions, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float base);

}  // namespace mt::cpu
