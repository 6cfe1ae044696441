// mla_layout.cu: one thread per element copied; one per (token, column) of k_pe's gradient, summing over the heads.
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/mla_layout.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

template <typename E>
__global__ void keys_values_kernel(E* k, E* v, const E* kv, const E* k_pe, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv) {
  const int64_t wk = dn + dr, wkv = dn + dv, per_head = wk + dv, total = T * H * per_head;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % per_head, th = i / per_head, t = th / H;
    if (c < dn) {
      k[th * wk + c] = kv[th * wkv + c];
    } else if (c < wk) {
      k[th * wk + c] = k_pe[t * dr + (c - dn)];
    } else {
      v[th * dv + (c - wk)] = kv[th * wkv + dn + (c - wk)];
    }
  }
}

template <typename E>
__global__ void keys_values_backward_kernel(E* dkv, const E* dk, const E* dv, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv_width) {
  const int64_t wk = dn + dr, wkv = dn + dv_width, total = T * H * wkv;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % wkv, th = i / wkv;
    dkv[i] = c < dn ? dk[th * wk + c] : dv[th * dv_width + (c - dn)];
  }
}

template <typename E>
__global__ void k_pe_grad_kernel(E* dk_pe, const E* dk, int64_t T, int64_t H, int64_t dn, int64_t dr) {
  const int64_t wk = dn + dr, total = T * dr;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % dr, t = i / dr;
    float sum = 0.0f;
    for (int64_t j = 0; j < H; ++j) sum += to_f(dk[(t * H + j) * wk + dn + e]);
    dk_pe[i] = from_f<E>(sum);
  }
}

}  // namespace

void mla_keys_values(bf16* k, bf16* v, const bf16* kv, const bf16* k_pe, const MlaHeads& s, cudaStream_t stream) {
  const int64_t total = s.tokens * s.heads * (s.nope + s.rope + s.value);
  if (total == 0) return;
  if (s.type == F16::kFP16) {
    keys_values_kernel<<<grid_for(total, 256), 256, 0, stream>>>(hp(k), hp(v), hp(kv), hp(k_pe), s.tokens, s.heads, s.nope, s.rope, s.value);
  } else {
    keys_values_kernel<<<grid_for(total, 256), 256, 0, stream>>>(k, v, kv, k_pe, s.tokens, s.heads, s.nope, s.rope, s.value);
  }
  MT_CUDA_CHECK_LAUNCH();
}

void mla_keys_values_backward(bf16* dkv, bf16* dk_pe, const bf16* dk, const bf16* dv, const MlaHeads& s, cudaStream_t stream) {
  const int64_t total = s.tokens * s.heads * (s.nope + s.value), pe = s.tokens * s.rope;
  if (total == 0) return;
  if (s.type == F16::kFP16) {
    keys_values_backward_kernel<<<grid_for(total, 256), 256, 0, stream>>>(hp(dkv), hp(dk), hp(dv), s.tokens, s.heads, s.nope, s.rope, s.value);
    k_pe_grad_kernel<<<grid_for(pe, 256), 256, 0, stream>>>(hp(dk_pe), hp(dk), s.tokens, s.heads, s.nope, s.rope);
  } else {
    keys_values_backward_kernel<<<grid_for(total, 256), 256, 0, stream>>>(dkv, dk, dv, s.tokens, s.heads, s.nope, s.rope, s.value);
    k_pe_grad_kernel<<<grid_for(pe, 256), 256, 0, stream>>>(dk_pe, dk, s.tokens, s.heads, s.nope, s.rope);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
