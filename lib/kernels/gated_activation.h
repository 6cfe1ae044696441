// gated_activation.h: a gated MLP's activation, both engines: fc1's row is [gate (F) | linear (F)] and the output
// act(g) * (u + linear_offset), act(g) = g sigmoid(alpha g) (alpha 1: SiLU, SwiGLU's; 1.702: Megatron's quick GELU,
// --quick-geglu), where with a clamp c > 0 (--activation-func-clamp-value) g is min(g, c) and u is within [-c, c] first
// (Megatron's glu(): torch.clamp, whose gradient passes at the bounds too). The default (alpha 1, no offset, no clamp)
// is plain SwiGLU, which keeps its own kernels.
#pragma once

namespace mt {

struct GatedActivation {
  float alpha = 1.0f;          // the sigmoid's slope: 1 SiLU, 1.702 quick GELU
  float linear_offset = 0.0f;  // --glu-linear-offset
  float clamp = 0.0f;          // --activation-func-clamp-value (0: none)
  bool plain_swiglu() const { return alpha == 1.0f && linear_offset == 0.0f && clamp <= 0.0f; }
};

inline constexpr float kQuickGeluAlpha = 1.702f;  // Megatron's quick_gelu: x sigmoid(1.702 x)

}  // namespace mt
