// context_attention.cu: see context_attention.h. The merges and additions run over (sample, row, head) with a
// thread per element of the head dimension's runs; cuDNN does the attention.
#include "kernels/cuda/context_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

// The block's queries: rows [row0, row0 + rows) of each sample's 2c.
struct QueryRows {
  int64_t row0, rows;
};
QueryRows query_rows(const RingShape& s, RingBlock kind) { return kind == RingBlock::kLastQueries ? QueryRows{s.c, s.c} : QueryRows{0, 2 * s.c}; }

SdpaShape block_shape(const RingShape& s, RingBlock kind) {
  SdpaShape sh{s.B, 2 * s.c, s.Hq, s.Hk, s.D, s.scale, s.type, s.documents};
  sh.q_rows = 2 * s.c;
  sh.kv_rows = 2 * s.c;
  switch (kind) {
    case RingBlock::kDiagonal: sh.causal = true; break;
    case RingBlock::kFirstKeys: sh.causal = false, sh.Sk = s.c; break;
    case RingBlock::kLastQueries: sh.causal = false, sh.S = s.c, sh.Sk = 2 * s.c; break;
  }
  return sh;
}

// acc, acc_lse <- the merge of (acc, acc_lse) and (o, lse) for rows [row0, row0 + rows) of each sample; first: (o, lse).
template <typename T16>
__global__ void merge_kernel(float* acc, float* acc_lse, const T16* o, const float* lse, int64_t B, int64_t R, int64_t rows, int64_t row0,
                             int64_t H, int64_t D, bool first) {
  const int64_t n = B * rows * H;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.y) + threadIdx.y; e < n; e += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    const int64_t b = e / (rows * H), r = row0 + (e / H) % rows, h = e % H;
    const int64_t li = (b * H + h) * R + r;
    const float lb = lse[li];
    float wa = 0.0f, wb = 1.0f, merged = lb;
    if (!first) {
      const float la = acc_lse[li], m = fmaxf(la, lb);
      merged = m + logf(expf(la - m) + expf(lb - m));
      wa = expf(la - merged);
      wb = expf(lb - merged);
    }
    const int64_t base = ((b * R + r) * H + h) * D;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
      const float ob = to_f(o[base + k]);
      acc[base + k] = first ? ob : acc[base + k] * wa + ob * wb;
    }
    __syncwarp();
    if (threadIdx.x == 0) acc_lse[li] = merged;
  }
}

// acc[rows of each sample] += x (16-bit), width values per row.
template <typename T16>
__global__ void add_rows_kernel(float* acc, const T16* x, int64_t B, int64_t R, int64_t rows, int64_t row0, int64_t width) {
  const int64_t n = B * rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / (rows * width), r = row0 + (i / width) % rows, k = i % width;
    const int64_t at = (b * R + r) * width + k;
    acc[at] += to_f(x[at]);
  }
}

template <typename T16>
__global__ void to_16_kernel(T16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f<T16>(in[i]);
  }
}

// bias[b, i, j] for the block's query i (local row q0 + i) and key j (the source's row j, at its place in the sequence).
template <typename T16>
__global__ void ring_document_bias_kernel(T16* bias, const int32_t* row_start, int64_t B, int64_t c, int64_t cp, int64_t source, int64_t q0,
                                          int64_t queries, int64_t keys, T16 low) {
  const int64_t n = B * queries * keys;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % keys, q = (i / keys) % queries, b = i / (keys * queries);
    const int64_t key_place = (j < c ? source : 2 * cp - 1 - source) * c + j % c;
    bias[i] = key_place < row_start[b * 2 * c + q0 + q] ? low : static_cast<T16>(0.0f);
  }
}

unsigned blocks_for(int64_t n, int64_t per_block) { return static_cast<unsigned>(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, 4096)); }

void add_rows(float* acc, const bf16* x, int64_t B, int64_t R, QueryRows q, int64_t width, F16 type, cudaStream_t stream) {
  const int64_t n = B * q.rows * width;
  if (n == 0) return;
  if (type == F16::kFP16) add_rows_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(acc, reinterpret_cast<const __half*>(x), B, R, q.rows, q.row0, width);
  else add_rows_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(acc, x, B, R, q.rows, q.row0, width);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void ring_document_bias(bf16* bias, const int32_t* row_start, const RingShape& s, int64_t cp, int64_t rank, int64_t source, cudaStream_t stream) {
  if (s.c <= 0) throw std::invalid_argument("ring_document_bias: no chunk");
  const RingBlock kind = ring_block(rank, source);
  const QueryRows qr = query_rows(s, kind);
  const int64_t keys = kind == RingBlock::kFirstKeys ? s.c : 2 * s.c, n = s.B * qr.rows * keys;
  // (document_bias.h's values: bf16 -1.0e30, fp16 -65504)
  if (s.type == F16::kFP16) {
    ring_document_bias_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<__half*>(bias), row_start, s.B, s.c, cp, source, qr.row0, qr.rows,
                                                                      keys, __ushort_as_half(0xFBFFu));
  } else {
    ring_document_bias_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(bias, row_start, s.B, s.c, cp, source, qr.row0, qr.rows, keys,
                                                                      __ushort_as_bfloat16(0xF14Au));
  }
  MT_CUDA_CHECK(cudaGetLastError());
}

std::string ring_check(const RingShape& s) {
  if (s.c <= 0 || s.c % 4 != 0) return "ring attention: the chunk length (sequence / (2 x CP)) must be a positive multiple of 4";
  for (RingBlock kind : {RingBlock::kDiagonal, RingBlock::kFirstKeys, RingBlock::kLastQueries}) {
    const std::string why = CudnnSdpa::instance().check(block_shape(s, kind));
    if (!why.empty()) return why;
  }
  return "";
}

RingBlock ring_block(int64_t rank, int64_t source) {
  return source == rank ? RingBlock::kDiagonal : source < rank ? RingBlock::kFirstKeys : RingBlock::kLastQueries;
}

// cuDNN takes every tensor 16-byte aligned: the last-queries block's statistics start c floats in.
void check_chunk(const RingShape& s) {
  if (s.c <= 0 || s.c % 4 != 0) {
    throw std::invalid_argument("ring attention: the chunk length (sequence / (2 x CP)) must be a positive multiple of 4, got " + std::to_string(s.c));
  }
}

void ring_block_forward(const RingShape& s, RingBlock kind, const bf16* q, const bf16* k, const bf16* v, const RingScratch& scratch, float* acc,
                        float* acc_lse, bool first, cudaStream_t stream, const bf16* bias) {
  check_chunk(s);
  if (s.documents != (bias != nullptr)) throw std::logic_error("ring attention: a document bias exactly when the shape has documents");
  if (first && kind != RingBlock::kDiagonal) throw std::logic_error("ring attention: the first block must be the diagonal (it covers every row)");
  const SdpaShape sh = block_shape(s, kind);
  const QueryRows qr = query_rows(s, kind);
  const int64_t R = 2 * s.c, qoff = qr.row0 * s.Hq * s.D;
  CudnnSdpa::instance().forward(sh, q + qoff, k, v, scratch.out + qoff, scratch.lse + qr.row0, stream, bias);
  const int64_t n = s.B * qr.rows * s.Hq;
  const dim3 threads(32, 8);
  if (s.type == F16::kFP16) {
    merge_kernel<<<blocks_for(n, 8), threads, 0, stream>>>(acc, acc_lse, reinterpret_cast<const __half*>(scratch.out), scratch.lse, s.B, R, qr.rows,
                                                          qr.row0, s.Hq, s.D, first);
  } else {
    merge_kernel<<<blocks_for(n, 8), threads, 0, stream>>>(acc, acc_lse, scratch.out, scratch.lse, s.B, R, qr.rows, qr.row0, s.Hq, s.D, first);
  }
  MT_CUDA_CHECK(cudaGetLastError());
}

void ring_output(const RingShape& s, const float* acc, bf16* out, cudaStream_t stream) { ring_to_16(acc, out, s.B * 2 * s.c * s.Hq * s.D, s.type, stream); }

void ring_to_16(const float* in, bf16* out, int64_t n, F16 type, cudaStream_t stream) {
  if (n == 0) return;
  if (type == F16::kFP16) to_16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(reinterpret_cast<__half*>(out), in, n);
  else to_16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(out, in, n);
  MT_CUDA_CHECK(cudaGetLastError());
}

void ring_block_backward(const RingShape& s, RingBlock kind, const bf16* q, const bf16* k, const bf16* v, const bf16* out, const bf16* dout,
                         const float* lse, const RingScratch& scratch, float* dq, float* dk, float* dv, cudaStream_t stream, const bf16* bias) {
  check_chunk(s);
  if (s.documents != (bias != nullptr)) throw std::logic_error("ring attention: a document bias exactly when the shape has documents");
  const SdpaShape sh = block_shape(s, kind);
  const QueryRows qr = query_rows(s, kind);
  const QueryRows kr = kind == RingBlock::kFirstKeys ? QueryRows{0, s.c} : QueryRows{0, 2 * s.c};  // the keys the block reads
  const int64_t R = 2 * s.c, qoff = qr.row0 * s.Hq * s.D;
  CudnnSdpa::instance().backward(sh, q + qoff, k, v, out + qoff, dout + qoff, lse + qr.row0, scratch.dq + qoff, scratch.dk, scratch.dv, stream, bias);
  add_rows(dq, scratch.dq, s.B, R, qr, s.Hq * s.D, s.type, stream);
  add_rows(dk, scratch.dk, s.B, R, kr, s.Hk * s.D, s.type, stream);
  add_rows(dv, scratch.dv, s.B, R, kr, s.Hk * s.D, s.type, stream);
}

}  // namespace mt::cuda
