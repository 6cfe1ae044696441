// activation_bf16.cu: elementwise; eight bf16 values per thread step (16-byte loads) where sizes and
// alignment allow, one otherwise.
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/swiglu_math.cuh"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;

constexpr float kSqrtHalf = 0.7071067811865476f, kInvSqrt2Pi = 0.3989422804014327f;

// Erf: the exact form x Phi(x) (Megatron's F.gelu), else the tanh form (its bias-GELU fusion).
template <bool Erf>
__device__ __forceinline__ float gelu(float v) {
  if constexpr (Erf) return 0.5f * v * (1.0f + erff(v * kSqrtHalf));
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v)));
}
template <bool Erf>
__device__ __forceinline__ float gelu_grad(float v) {
  if constexpr (Erf) return 0.5f * (1.0f + erff(v * kSqrtHalf)) + v * kInvSqrt2Pi * expf(-0.5f * v * v);
  const float t = tanhf(kSqrt2OverPi * (v + kCoeff * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
}

#define MT_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T16, bool Erf>
__global__ void gelu_fwd(T16* y, const T16* x, int64_t n) {
  MT_GRID_LOOP(i, n) y[i] = from_f<T16>(gelu<Erf>(to_f(x[i])));
}
template <typename T16, bool Erf>
__global__ void gelu_bwd(T16* dx, const T16* dy, const T16* x, int64_t n) {
  MT_GRID_LOOP(i, n) dx[i] = from_f<T16>(to_f(dy[i]) * gelu_grad<Erf>(to_f(x[i])));
}
template <typename T16>
__global__ void squared_relu_fwd(T16* y, const T16* x, int64_t n) {
  MT_GRID_LOOP(i, n) {
    const float v = fmaxf(to_f(x[i]), 0.0f);
    y[i] = from_f<T16>(v * v);
  }
}
template <typename T16>
__global__ void squared_relu_bwd(T16* dx, const T16* dy, const T16* x, int64_t n) {
  MT_GRID_LOOP(i, n) dx[i] = from_f<T16>(2.0f * fmaxf(to_f(x[i]), 0.0f) * to_f(dy[i]));
}
template <typename T16>
__global__ void swiglu_fwd(T16* y, const T16* x, int64_t N, int64_t F) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    y[e] = from_f<T16>(swiglu_value(to_f(x[n * 2 * F + i]), to_f(x[n * 2 * F + F + i])));
  }
}
template <typename T16>
__global__ void swiglu_bwd(T16* dx, const T16* dy, const T16* x, int64_t N, int64_t F) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    const float g = to_f(x[n * 2 * F + i]), u = to_f(x[n * 2 * F + F + i]);
    float dg, du;
    swiglu_grads(to_f(dy[e]), g, u, dg, du);
    dx[n * 2 * F + F + i] = from_f<T16>(du);
    dx[n * 2 * F + i] = from_f<T16>(dg);
  }
}

// The general gated unit (kernels/gated_activation.h): g sigmoid(alpha g) (u + offset) after the clamp, and its
// gradients (zero for an input the clamp held at a bound it passed; torch.clamp passes the bounds themselves).
__device__ __forceinline__ float gated_value(float g, float u, const GatedActivation& a) {
  if (a.clamp > 0.0f) {
    g = fminf(g, a.clamp);
    u = fminf(fmaxf(u, -a.clamp), a.clamp);
  }
  return __fdividef(g, 1.0f + __expf(-a.alpha * g)) * (u + a.linear_offset);
}
__device__ __forceinline__ void gated_grads(float d, float g, float u, const GatedActivation& a, float& dg, float& du) {
  bool g_passes = true, u_passes = true;
  if (a.clamp > 0.0f) {
    g_passes = g <= a.clamp;
    u_passes = u >= -a.clamp && u <= a.clamp;
    g = fminf(g, a.clamp);
    u = fminf(fmaxf(u, -a.clamp), a.clamp);
  }
  const float s = __fdividef(1.0f, 1.0f + __expf(-a.alpha * g));
  du = u_passes ? d * g * s : 0.0f;
  dg = g_passes ? d * (u + a.linear_offset) * (s * (1.0f + a.alpha * g * (1.0f - s))) : 0.0f;
}
template <typename T16>
__global__ void gated_fwd(T16* y, const T16* x, int64_t N, int64_t F, GatedActivation a) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    y[e] = from_f<T16>(gated_value(to_f(x[n * 2 * F + i]), to_f(x[n * 2 * F + F + i]), a));
  }
}
template <typename T16>
__global__ void gated_bwd(T16* dx, const T16* dy, const T16* x, int64_t N, int64_t F, GatedActivation a) {
  MT_GRID_LOOP(e, N * F) {
    const int64_t n = e / F, i = e % F;
    float dg, du;
    gated_grads(to_f(dy[e]), to_f(x[n * 2 * F + i]), to_f(x[n * 2 * F + F + i]), a, dg, du);
    dx[n * 2 * F + F + i] = from_f<T16>(du);
    dx[n * 2 * F + i] = from_f<T16>(dg);
  }
}

// Vectorised forms: 8 bf16 per thread step (16-byte loads); used when the sizes and pointers allow.
template <typename T16, bool Erf>
__global__ void gelu_fwd8(T16* y, const T16* x, int64_t n8) {
  MT_GRID_LOOP(i, n8) {
    Bf16x8 v = load_bf16x8(x + 8 * i);
#pragma unroll
    for (int k = 0; k < 8; ++k) v.x[k] = gelu<Erf>(v.x[k]);
    store_bf16x8(y + 8 * i, v);
  }
}
template <typename T16, bool Erf>
__global__ void gelu_bwd8(T16* dx, const T16* dy, const T16* x, int64_t n8) {
  MT_GRID_LOOP(i, n8) {
    Bf16x8 d = load_bf16x8(dy + 8 * i);
    const Bf16x8 v = load_bf16x8(x + 8 * i);
#pragma unroll
    for (int k = 0; k < 8; ++k) d.x[k] *= gelu_grad<Erf>(v.x[k]);
    store_bf16x8(dx + 8 * i, d);
  }
}
template <typename T16>
__global__ void swiglu_fwd8(T16* y, const T16* x, int64_t N, int64_t F) {
  const int64_t f8 = F / 8;
  MT_GRID_LOOP(e, N * f8) {
    const int64_t n = e / f8, i = (e % f8) * 8;
    const Bf16x8 g = load_bf16x8(x + n * 2 * F + i), u = load_bf16x8(x + n * 2 * F + F + i);
    Bf16x8 o;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.x[k] = swiglu_value(g.x[k], u.x[k]);
    store_bf16x8(y + n * F + i, o);
  }
}
template <typename T16>
__global__ void swiglu_bwd8(T16* dx, const T16* dy, const T16* x, int64_t N, int64_t F) {
  const int64_t f8 = F / 8;
  MT_GRID_LOOP(e, N * f8) {
    const int64_t n = e / f8, i = (e % f8) * 8;
    const Bf16x8 g = load_bf16x8(x + n * 2 * F + i), u = load_bf16x8(x + n * 2 * F + F + i), d = load_bf16x8(dy + n * F + i);
    Bf16x8 dg, du;
#pragma unroll
    for (int k = 0; k < 8; ++k) swiglu_grads(d.x[k], g.x[k], u.x[k], dg.x[k], du.x[k]);
    store_bf16x8(dx + n * 2 * F + i, dg);
    store_bf16x8(dx + n * 2 * F + F + i, du);
  }
}

}  // namespace

template <typename T16, bool Erf>
void gelu_forward_bf16_t(T16* y, const T16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 8 == 0 && aligned16(y) && aligned16(x)) {
    gelu_fwd8<T16, Erf><<<grid_for(n / 8, 256), 256, 0, stream>>>(y, x, n / 8);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  gelu_fwd<T16, Erf><<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
template <typename T16, bool Erf>
void gelu_backward_bf16_t(T16* dx, const T16* dy, const T16* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    gelu_bwd8<T16, Erf><<<grid_for(n / 8, 256), 256, 0, stream>>>(dx, dy, x, n / 8);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  gelu_bwd<T16, Erf><<<grid_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
template <typename T16>
void swiglu_forward_bf16_t(T16* y, const T16* x, int64_t N, int64_t F, cudaStream_t stream) {
  if (N * F == 0) return;
  if (F % 8 == 0 && aligned16(y) && aligned16(x)) {
    swiglu_fwd8<<<grid_for(N * F / 8, 256), 256, 0, stream>>>(y, x, N, F);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_fwd<<<grid_for(N * F, 256), 256, 0, stream>>>(y, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}
template <typename T16>
void swiglu_backward_bf16_t(T16* dx, const T16* dy, const T16* x, int64_t N, int64_t F, cudaStream_t stream) {
  if (N * F == 0) return;
  if (F % 8 == 0 && aligned16(dx) && aligned16(dy) && aligned16(x)) {
    swiglu_bwd8<<<grid_for(N * F / 8, 256), 256, 0, stream>>>(dx, dy, x, N, F);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  swiglu_bwd<<<grid_for(N * F, 256), 256, 0, stream>>>(dx, dy, x, N, F);
  MT_CUDA_CHECK_LAUNCH();
}

void gelu_forward_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t stream, F16 t, bool erf) {
  if (t == F16::kFP16) {
    if (erf) gelu_forward_bf16_t<__half, true>(hp(y), hp(x), n, stream);
    else gelu_forward_bf16_t<__half, false>(hp(y), hp(x), n, stream);
  } else {
    if (erf) gelu_forward_bf16_t<bf16, true>(y, x, n, stream);
    else gelu_forward_bf16_t<bf16, false>(y, x, n, stream);
  }
}
void gelu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t n, cudaStream_t stream, F16 t, bool erf) {
  if (t == F16::kFP16) {
    if (erf) gelu_backward_bf16_t<__half, true>(hp(dx), hp(dy), hp(x), n, stream);
    else gelu_backward_bf16_t<__half, false>(hp(dx), hp(dy), hp(x), n, stream);
  } else {
    if (erf) gelu_backward_bf16_t<bf16, true>(dx, dy, x, n, stream);
    else gelu_backward_bf16_t<bf16, false>(dx, dy, x, n, stream);
  }
}
void squared_relu_forward_bf16(bf16* y, const bf16* x, int64_t n, cudaStream_t stream, F16 t) {
  if (n == 0) return;
  if (t == F16::kFP16) squared_relu_fwd<<<grid_for(n, 256), 256, 0, stream>>>(hp(y), hp(x), n);
  else squared_relu_fwd<<<grid_for(n, 256), 256, 0, stream>>>(y, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void squared_relu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t n, cudaStream_t stream, F16 t) {
  if (n == 0) return;
  if (t == F16::kFP16) squared_relu_bwd<<<grid_for(n, 256), 256, 0, stream>>>(hp(dx), hp(dy), hp(x), n);
  else squared_relu_bwd<<<grid_for(n, 256), 256, 0, stream>>>(dx, dy, x, n);
  MT_CUDA_CHECK_LAUNCH();
}
void swiglu_forward_bf16(bf16* y, const bf16* x, int64_t N, int64_t F, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) swiglu_forward_bf16_t(hp(y), hp(x), N, F, stream);
  else swiglu_forward_bf16_t(y, x, N, F, stream);
}
void swiglu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) swiglu_backward_bf16_t(hp(dx), hp(dy), hp(x), N, F, stream);
  else swiglu_backward_bf16_t(dx, dy, x, N, F, stream);
}

void glu_forward_bf16(bf16* y, const bf16* x, int64_t N, int64_t F, const GatedActivation& a, cudaStream_t stream, F16 t) {
  if (a.plain_swiglu()) {
    swiglu_forward_bf16(y, x, N, F, stream, t);
    return;
  }
  if (N * F == 0) return;
  if (t == F16::kFP16) gated_fwd<<<grid_for(N * F, 256), 256, 0, stream>>>(hp(y), hp(x), N, F, a);
  else gated_fwd<<<grid_for(N * F, 256), 256, 0, stream>>>(y, x, N, F, a);
  MT_CUDA_CHECK_LAUNCH();
}
void glu_backward_bf16(bf16* dx, const bf16* dy, const bf16* x, int64_t N, int64_t F, const GatedActivation& a, cudaStream_t stream, F16 t) {
  if (a.plain_swiglu()) {
    swiglu_backward_bf16(dx, dy, x, N, F, stream, t);
    return;
  }
  if (N * F == 0) return;
  if (t == F16::kFP16) gated_bwd<<<grid_for(N * F, 256), 256, 0, stream>>>(hp(dx), hp(dy), hp(x), N, F, a);
  else gated_bwd<<<grid_for(N * F, 256), 256, 0, stream>>>(dx, dy, x, N, F, a);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
