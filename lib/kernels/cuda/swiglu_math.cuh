// swiglu_math.cuh (CUDA): SwiGLU's forward value and its two input gradients in fp32, one definition for every
// kernel that computes them (the activation kernels and the FP8 casts fused with them), so that their 16-bit
// results agree bit for bit.
#pragma once

namespace mt::cuda {

// The sigmoid and the division by the fast intrinsics (__expf, and __fdividef's approximate reciprocal: within 2 ulp
// of fp32, then rounded to 16 bits; for g below about -87, where 1 + exp(-g) passes 2^126, silu(g) comes out 0 instead
// of a value below 1e-36), not IEEE division's instruction sequence: the FP8 casts fused with SwiGLU are bound by their
// instruction issue.

// silu(g) * u
__device__ __forceinline__ float swiglu_value(float g, float u) { return __fdividef(g, 1.0f + __expf(-g)) * u; }

// d(silu(g) * u) with the output gradient d: dg (the gate's), du (the up projection's)
__device__ __forceinline__ void swiglu_grads(float d, float g, float u, float& dg, float& du) {
  const float s = __fdividef(1.0f, 1.0f + __expf(-g));
  du = d * g * s;
  dg = d * u * (s * (1.0f + g * (1.0f - s)));
}

}  // namespace mt::cuda
