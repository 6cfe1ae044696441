// mla_layout.cu: 16-byte vectors, a block per token (below); else one thread per element copied and one per (token,
// column) of k_pe's gradient, summing over the heads.
#include <cstdint>
#include <initializer_list>

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

// The same with 16-byte vectors (8 values of 2 bytes) where every width is a multiple of 8 and the buffers are aligned:
// one block per token, its threads over the token's heads' vectors (the layout is memory-bound: the scalar form's 2-byte
// accesses and 64-bit index divisions per element ran at about a seventh of the bandwidth).
__global__ void keys_values_vec_kernel(uint4* k, uint4* v, const uint4* kv, const uint4* k_pe, int H, int dn, int dr, int dv) {
  const int64_t t = blockIdx.x;
  const int wk = dn + dr, wkv = dn + dv, per_head = wk + dv;
  for (int i = threadIdx.x; i < H * per_head; i += blockDim.x) {
    const int j = i / per_head, c = i % per_head;
    const int64_t th = t * H + j;
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
__global__ void keys_values_backward_vec_kernel(uint4* dkv, E* dk_pe, const uint4* dk, const uint4* dv, int H, int dn, int dr, int dv_width) {
  const int64_t t = blockIdx.x;
  const int wk = dn + dr, wkv = dn + dv_width;  // (in vectors)
  for (int i = threadIdx.x; i < H * wkv; i += blockDim.x) {
    const int j = i / wkv, c = i % wkv;
    const int64_t th = t * H + j;
    dkv[th * wkv + c] = c < dn ? dk[th * wk + c] : dv[th * dv_width + (c - dn)];
  }
  // k_pe's gradient: a vector of 8 columns a thread, summed over the heads in fp32
  for (int c = threadIdx.x; c < dr; c += blockDim.x) {
    float sum[8] = {};
    for (int j = 0; j < H; ++j) {
      const uint4 raw = dk[(t * H + j) * wk + dn + c];
      const E* e = reinterpret_cast<const E*>(&raw);
      for (int q = 0; q < 8; ++q) sum[q] += to_f(e[q]);
    }
    uint4 out;
    E* o = reinterpret_cast<E*>(&out);
    for (int q = 0; q < 8; ++q) o[q] = from_f<E>(sum[q]);
    reinterpret_cast<uint4*>(dk_pe)[t * dr + c] = out;
  }
}

bool vectorizable(const MlaHeads& s, std::initializer_list<const void*> buffers) {
  if (s.nope % 8 != 0 || s.rope % 8 != 0 || s.value % 8 != 0) return false;
  for (const void* p : buffers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

}  // namespace

void mla_keys_values(bf16* k, bf16* v, const bf16* kv, const bf16* k_pe, const MlaHeads& s, cudaStream_t stream) {
  const int64_t total = s.tokens * s.heads * (s.nope + s.rope + s.value);
  if (total == 0) return;
  if (vectorizable(s, {k, v, kv, k_pe})) {
    keys_values_vec_kernel<<<static_cast<unsigned>(s.tokens), 256, 0, stream>>>(
        reinterpret_cast<uint4*>(k), reinterpret_cast<uint4*>(v), reinterpret_cast<const uint4*>(kv), reinterpret_cast<const uint4*>(k_pe),
        static_cast<int>(s.heads), static_cast<int>(s.nope / 8), static_cast<int>(s.rope / 8), static_cast<int>(s.value / 8));
  } else if (s.type == F16::kFP16) {
    keys_values_kernel<<<grid_for(total, 256), 256, 0, stream>>>(hp(k), hp(v), hp(kv), hp(k_pe), s.tokens, s.heads, s.nope, s.rope, s.value);
  } else {
    keys_values_kernel<<<grid_for(total, 256), 256, 0, stream>>>(k, v, kv, k_pe, s.tokens, s.heads, s.nope, s.rope, s.value);
  }
  MT_CUDA_CHECK_LAUNCH();
}

void mla_keys_values_backward(bf16* dkv, bf16* dk_pe, const bf16* dk, const bf16* dv, const MlaHeads& s, cudaStream_t stream) {
  const int64_t total = s.tokens * s.heads * (s.nope + s.value), pe = s.tokens * s.rope;
  if (total == 0) return;
  if (vectorizable(s, {dkv, dk_pe, dk, dv})) {
    const auto* dk4 = reinterpret_cast<const uint4*>(dk);
    const auto* dv4 = reinterpret_cast<const uint4*>(dv);
    const int H = static_cast<int>(s.heads), dn = static_cast<int>(s.nope / 8), dr = static_cast<int>(s.rope / 8), dvw = static_cast<int>(s.value / 8);
    if (s.type == F16::kFP16) {
      keys_values_backward_vec_kernel<<<static_cast<unsigned>(s.tokens), 256, 0, stream>>>(reinterpret_cast<uint4*>(dkv), hp(dk_pe), dk4, dv4, H, dn, dr, dvw);
    } else {
      keys_values_backward_vec_kernel<<<static_cast<unsigned>(s.tokens), 256, 0, stream>>>(reinterpret_cast<uint4*>(dkv), dk_pe, dk4, dv4, H, dn, dr, dvw);
    }
  } else if (s.type == F16::kFP16) {
    keys_values_backward_kernel<<<grid_for(total, 256), 256, 0, stream>>>(hp(dkv), hp(dk), hp(dv), s.tokens, s.heads, s.nope, s.rope, s.value);
    k_pe_grad_kernel<<<grid_for(pe, 256), 256, 0, stream>>>(hp(dk_pe), hp(dk), s.tokens, s.heads, s.nope, s.rope);
  } else {
    keys_values_backward_kernel<<<grid_for(total, 256), 256, 0, stream>>>(dkv, dk, dv, s.tokens, s.heads, s.nope, s.rope, s.value);
    k_pe_grad_kernel<<<grid_for(pe, 256), 256, 0, stream>>>(dk_pe, dk, s.tokens, s.heads, s.nope, s.rope);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
