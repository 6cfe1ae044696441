// qkv_layout.h (CUDA): between the fused QKV projection in Megatron's grouped layout [T, ng, (nh/ng + 2), d]
// (the queries of a group, then its key, then its value) and the separate Q [T, nh, d], K, V [T, ng, d]
// tensors attention reads, with rotary embedding (rotate-half, or interleaved pairs, on the first rot_dim dims) applied to Q
// and K on the way (table from rope.h; null table: no rotation).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

struct QkvSplit {
  bf16 *q = nullptr, *k = nullptr, *v = nullptr;  // [rows, heads * head_dim], [rows, groups * head_dim] twice
  const bf16* qkv = nullptr;                      // [rows, groups * (heads / groups + 2) * head_dim], Megatron's grouped layout
  const int32_t* positions = nullptr;
  const float* table = nullptr;  // RoPE's table (null: no rotation)
  int64_t rows = 0, heads = 0, groups = 0, head_dim = 0, rot_dim = 0;
  F16 type = F16::kBF16;
  bool interleaved = false;  // --rotary-interleaved: pairs (2i, 2i + 1) instead of rotate-half's (i, i + rot_dim / 2)
};
void qkv_split_rope(const QkvSplit& a, cudaStream_t stream);
// The backward: gradients of Q, K, V (rotated back) gathered into the fused layout.
struct QkvMerge {
  bf16* dqkv = nullptr;
  const bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
  const int32_t* positions = nullptr;
  const float* table = nullptr;
  int64_t rows = 0, heads = 0, groups = 0, head_dim = 0, rot_dim = 0;
  F16 type = F16::kBF16;
  bool interleaved = false;  // --rotary-interleaved: pairs (2i, 2i + 1) instead of rotate-half's (i, i + rot_dim / 2)
};
void qkv_merge_rope_backward(const QkvMerge& a, cudaStream_t stream);


}  // namespace mt::cuda
