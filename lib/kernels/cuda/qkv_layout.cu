// qkv_layout.cu: one thread per output element; the rotation partner is read from the same row.
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/qkv_layout.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

struct Slot {
  int64_t kind, head;  // kind 0: query, 1: key, 2: value
};

__device__ __forceinline__ Slot slot_of(int64_t slot, int64_t qpg) {
  const int64_t g = slot / (qpg + 2), r = slot % (qpg + 2);
  if (r < qpg) return {0, g * qpg + r};
  return {r == qpg ? 1 : 2, g};
}

__device__ __forceinline__ float rotated(const bf16* row, int64_t j, int64_t half, float c, float s) {
  const float xj = __bfloat162float(row[j]);
  return j < half ? xj * c - __bfloat162float(row[j + half]) * s : xj * c + __bfloat162float(row[j - half]) * s;
}

__global__ void split_kernel(bf16* q, bf16* k, bf16* v, const bf16* qkv, const int32_t* pos, const float* table, int64_t T, int64_t nh,
                             int64_t ng, int64_t d, int64_t rot) {
  const int64_t qpg = nh / ng, slots = ng * (qpg + 2), total = T * slots * d, half = rot / 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % d, ts = e / d, slot = ts % slots, t = ts / slots;
    const Slot sl = slot_of(slot, qpg);
    const bf16* row = qkv + ts * d;
    float val;
    if (table && sl.kind < 2 && j < rot) {
      const int64_t i = j < half ? j : j - half;
      const float c = table[(static_cast<int64_t>(pos[t]) * half + i) * 2], s = table[(static_cast<int64_t>(pos[t]) * half + i) * 2 + 1];
      val = rotated(row, j, half, c, s);
    } else {
      val = __bfloat162float(row[j]);
    }
    const bf16 o = __float2bfloat16(val);
    if (sl.kind == 0) q[(t * nh + sl.head) * d + j] = o;
    else if (sl.kind == 1) k[(t * ng + sl.head) * d + j] = o;
    else v[(t * ng + sl.head) * d + j] = o;
  }
}

__global__ void merge_kernel(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const int32_t* pos, const float* table, int64_t T,
                             int64_t nh, int64_t ng, int64_t d, int64_t rot) {
  const int64_t qpg = nh / ng, slots = ng * (qpg + 2), total = T * slots * d, half = rot / 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % d, ts = e / d, slot = ts % slots, t = ts / slots;
    const Slot sl = slot_of(slot, qpg);
    const bf16* row = sl.kind == 0 ? dq + (t * nh + sl.head) * d : sl.kind == 1 ? dk + (t * ng + sl.head) * d : dv + (t * ng + sl.head) * d;
    float val;
    if (table && sl.kind < 2 && j < rot) {
      const int64_t i = j < half ? j : j - half;
      const float c = table[(static_cast<int64_t>(pos[t]) * half + i) * 2], s = table[(static_cast<int64_t>(pos[t]) * half + i) * 2 + 1];
      val = rotated(row, j, half, c, -s);  // the inverse rotation
    } else {
      val = __bfloat162float(row[j]);
    }
    dqkv[e] = __float2bfloat16(val);
  }
}

}  // namespace

void qkv_split_rope(bf16* q, bf16* k, bf16* v, const bf16* qkv, const int32_t* positions, const float* table, int64_t T, int64_t nh,
                    int64_t ng, int64_t d, int64_t rot_dim, cudaStream_t stream) {
  const int64_t total = T * (nh + 2 * ng) * d;
  if (total == 0) return;
  split_kernel<<<grid_for(total, 256), 256, 0, stream>>>(q, k, v, qkv, positions, table, T, nh, ng, d, rot_dim);
  MT_CUDA_CHECK_LAUNCH();
}

void qkv_merge_rope_backward(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv, const int32_t* positions, const float* table,
                             int64_t T, int64_t nh, int64_t ng, int64_t d, int64_t rot_dim, cudaStream_t stream) {
  const int64_t total = T * (nh + 2 * ng) * d;
  if (total == 0) return;
  merge_kernel<<<grid_for(total, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, positions, table, T, nh, ng, d, rot_dim);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
