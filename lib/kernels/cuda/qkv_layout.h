// qkv_layout.h (CUDA): between the fused QKV projection in Megatron's grouped layout [T, ng, (nh/ng + 2), d]
// (the queries of a group, then its key, then its value) and the separate Q [T, nh, d], K, V [T, ng, d]
// tensors attention reads, with rotary embedding (rotate-half on the first rot_dim dims) applied to Q
// and K on the way (table from rope.h; null table: no rotation).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

void qkv_split_rope(bf16* q, bf16* k, bf16* v, const bf16* qkv, const int32_t* positions, const float* table, int64_t T,
                    int64_t nh, int64_t ng, int64_t d, int64_t rot_dim, cudaStream_t stream, F16 t = F16::kBF16);
// The backward: gradients of Q, K, V (rotated back) gathered into the fused layout.
void qkv_merge_rope_backward(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const int32_t* positions, const float* table,
                             int64_t T, int64_t nh, int64_t ng, int64_t d, int64_t rot_dim, cudaStream_t stream, F16 t = F16::kBF16);


}  // namespace mt::cuda
