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

// Element j of a rotated head row: rotate-half pairs (i, i + half), or interleaved pairs (2i, 2i + 1)
// (--rotary-interleaved); its pair's frequency index into the table.
__device__ __forceinline__ int64_t pair_index(int64_t j, int64_t half, bool interleaved) { return interleaved ? j / 2 : j < half ? j : j - half; }
template <typename T16>
__device__ __forceinline__ float rotated(const T16* row, int64_t j, int64_t half, float c, float s, bool interleaved) {
  const float xj = to_f(row[j]);
  if (interleaved) return j % 2 == 0 ? xj * c - to_f(row[j + 1]) * s : xj * c + to_f(row[j - 1]) * s;
  return j < half ? xj * c - to_f(row[j + half]) * s : xj * c + to_f(row[j - half]) * s;
}

template <typename T16>
__global__ void split_kernel(T16* q, T16* k, T16* v, const T16* qkv, const int32_t* pos, const float* table, int64_t T, int64_t nh,
                             int64_t ng, int64_t d, int64_t rot, bool interleaved) {
  const int64_t qpg = nh / ng, slots = ng * (qpg + 2), total = T * slots * d, half = rot / 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % d, ts = e / d, slot = ts % slots, t = ts / slots;
    const Slot sl = slot_of(slot, qpg);
    const T16* row = qkv + ts * d;
    float val;
    if (table && sl.kind < 2 && j < rot) {
      const int64_t i = pair_index(j, half, interleaved);
      const float c = table[(static_cast<int64_t>(pos[t]) * half + i) * 2], s = table[(static_cast<int64_t>(pos[t]) * half + i) * 2 + 1];
      val = rotated(row, j, half, c, s, interleaved);
    } else {
      val = to_f(row[j]);
    }
    const T16 o = from_f<T16>(val);
    if (sl.kind == 0) q[(t * nh + sl.head) * d + j] = o;
    else if (sl.kind == 1) k[(t * ng + sl.head) * d + j] = o;
    else v[(t * ng + sl.head) * d + j] = o;
  }
}

template <typename T16>
__global__ void merge_kernel(T16* dqkv, const T16* dq, const T16* dk, const T16* dv, const int32_t* pos, const float* table, int64_t T,
                             int64_t nh, int64_t ng, int64_t d, int64_t rot, bool interleaved) {
  const int64_t qpg = nh / ng, slots = ng * (qpg + 2), total = T * slots * d, half = rot / 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = e % d, ts = e / d, slot = ts % slots, t = ts / slots;
    const Slot sl = slot_of(slot, qpg);
    const T16* row = sl.kind == 0 ? dq + (t * nh + sl.head) * d : sl.kind == 1 ? dk + (t * ng + sl.head) * d : dv + (t * ng + sl.head) * d;
    float val;
    if (table && sl.kind < 2 && j < rot) {
      const int64_t i = pair_index(j, half, interleaved);
      const float c = table[(static_cast<int64_t>(pos[t]) * half + i) * 2], s = table[(static_cast<int64_t>(pos[t]) * half + i) * 2 + 1];
      val = rotated(row, j, half, c, -s, interleaved);  // the inverse rotation
    } else {
      val = to_f(row[j]);
    }
    dqkv[e] = from_f<T16>(val);
  }
}

// Fast path (rot_dim == d or no rotation, d % 16 == 0): a thread moves 8 elements of the first half of
// a head row and their 8 rotation partners in the second half with 16-byte loads and stores.
template <bool kMerge, typename T16>
__global__ void layout_vec_kernel(T16* fused, T16* q, T16* k, T16* v, const int32_t* pos, const float* table, int64_t rows, int nh,
                                  int ng, int d) {
  const int qpg = nh / ng, slots = ng * (qpg + 2), half = d / 2, chunks = half / 8;
  const int64_t total = rows * slots * chunks;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(e % chunks);
    const int64_t ts = e / chunks;
    const int slot = static_cast<int>(ts % slots);
    const int64_t t = ts / slots;
    const int g = slot / (qpg + 2), r = slot % (qpg + 2);
    T16* sep = r < qpg ? q + (t * nh + g * qpg + r) * d : (r == qpg ? k : v) + (t * ng + g) * d;
    T16* fus = fused + ts * d;
    const int i0 = c * 8;
    Bf16x8 a = load_bf16x8((kMerge ? sep : fus) + i0), b = load_bf16x8((kMerge ? sep : fus) + half + i0);
    if (table && r <= qpg) {
      const float* tr = table + (static_cast<int64_t>(pos[t]) * half + i0) * 2;
#pragma unroll
      for (int k2 = 0; k2 < 8; ++k2) {
        const float cs = tr[2 * k2], sn = kMerge ? -tr[2 * k2 + 1] : tr[2 * k2 + 1];
        const float x1 = a.x[k2], x2 = b.x[k2];
        a.x[k2] = x1 * cs - x2 * sn;
        b.x[k2] = x2 * cs + x1 * sn;
      }
    }
    store_bf16x8((kMerge ? fus : sep) + i0, a);
    store_bf16x8((kMerge ? fus : sep) + half + i0, b);
  }
}

bool vec_ok(int64_t d, int64_t rot, const float* table, bool interleaved) { return d % 16 == 0 && (table == nullptr || (rot == d && !interleaved)); }

}  // namespace

template <typename T16>
void qkv_split_rope_t(T16* q, T16* k, T16* v, const T16* qkv, const int32_t* positions, const float* table, int64_t T, int64_t nh,
                    int64_t ng, int64_t d, int64_t rot_dim, bool interleaved, cudaStream_t stream) {
  const int64_t total = T * (nh + 2 * ng) * d;
  if (total == 0) return;
  if (vec_ok(d, rot_dim, table, interleaved)) {
    layout_vec_kernel<false><<<grid_for(total / 16, 256), 256, 0, stream>>>(const_cast<T16*>(qkv), q, k, v, positions, table, T,
                                                                            static_cast<int>(nh), static_cast<int>(ng), static_cast<int>(d));
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  split_kernel<<<grid_for(total, 256), 256, 0, stream>>>(q, k, v, qkv, positions, table, T, nh, ng, d, rot_dim, interleaved);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T16>
void qkv_merge_rope_backward_t(T16* dqkv, const T16* dq, const T16* dk, const T16* dv, const int32_t* positions, const float* table,
                             int64_t T, int64_t nh, int64_t ng, int64_t d, int64_t rot_dim, bool interleaved, cudaStream_t stream) {
  const int64_t total = T * (nh + 2 * ng) * d;
  if (total == 0) return;
  if (vec_ok(d, rot_dim, table, interleaved)) {
    layout_vec_kernel<true><<<grid_for(total / 16, 256), 256, 0, stream>>>(dqkv, const_cast<T16*>(dq), const_cast<T16*>(dk),
                                                                           const_cast<T16*>(dv), positions, table, T, static_cast<int>(nh),
                                                                           static_cast<int>(ng), static_cast<int>(d));
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  merge_kernel<<<grid_for(total, 256), 256, 0, stream>>>(dqkv, dq, dk, dv, positions, table, T, nh, ng, d, rot_dim, interleaved);
  MT_CUDA_CHECK_LAUNCH();
}

void qkv_split_rope(const QkvSplit& a, cudaStream_t stream) {
  if (a.type == F16::kFP16) {
    qkv_split_rope_t(hp(a.q), hp(a.k), hp(a.v), hp(a.qkv), a.positions, a.table, a.rows, a.heads, a.groups, a.head_dim, a.rot_dim, a.interleaved, stream);
  } else {
    qkv_split_rope_t(a.q, a.k, a.v, a.qkv, a.positions, a.table, a.rows, a.heads, a.groups, a.head_dim, a.rot_dim, a.interleaved, stream);
  }
}
void qkv_merge_rope_backward(const QkvMerge& a, cudaStream_t stream) {
  if (a.type == F16::kFP16) {
    qkv_merge_rope_backward_t(hp(a.dqkv), hp(a.dq), hp(a.dk), hp(a.dv), a.positions, a.table, a.rows, a.heads, a.groups, a.head_dim, a.rot_dim, a.interleaved, stream);
  } else {
    qkv_merge_rope_backward_t(a.dqkv, a.dq, a.dk, a.dv, a.positions, a.table, a.rows, a.heads, a.groups, a.head_dim, a.rot_dim, a.interleaved, stream);
  }
}

}  // namespace mt::cuda
