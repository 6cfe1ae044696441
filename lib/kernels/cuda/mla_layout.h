// mla_layout.h (CUDA): multi-latent attention's heads between its projections and cuDNN's attention (the CPU engine's
// model/cpu/mla_attention.cpp does the same copies). Forward: the key / value up projection's output kv [T, H, dn + dv]
// and the shared RoPE key k_pe [T, dr] (already rotated) into the attention's keys k [T, H, dn + dr] (each head's
// [k_nope | k_pe]) and values v [T, H, dv]. Backward: dk and dv back into dkv [T, H, dn + dv], and k_pe's gradient
// dk_pe [T, dr], the sum over the heads of their keys' last dr columns (in fp32, rounded once). 16-bit types (t).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

struct MlaHeads {
  int64_t tokens = 0, heads = 0, nope = 0, rope = 0, value = 0;  // T, H, dn, dr, dv
  F16 type = F16::kBF16;
};

void mla_keys_values(bf16* k, bf16* v, const bf16* kv, const bf16* k_pe, const MlaHeads& shape, cudaStream_t stream);
void mla_keys_values_backward(bf16* dkv, bf16* dk_pe, const bf16* dk, const bf16* dv, const MlaHeads& shape, cudaStream_t stream);

}  // namespace mt::cuda
