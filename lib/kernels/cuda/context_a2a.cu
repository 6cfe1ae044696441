// context_a2a.cu: see context_a2a.h. Plain copies of D-element head vectors, one thread per 16-bit element.
#include "kernels/cuda/context_a2a.h"

#include <algorithm>
#include <stdexcept>

#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

// rows x H heads of D values: element (row, head, d) <-> (group = head / Hc, row, head % Hc, d).
__global__ void pack_heads_kernel(uint16_t* out, const uint16_t* in, int64_t rows, int64_t H, int64_t Hc, int64_t D, bool unpack) {
  const int64_t n = rows * H * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, head = (i / D) % H, row = i / (D * H);
    const int64_t j = ((head / Hc) * rows + row) * Hc * D + (head % Hc) * D + d;
    if (unpack) out[i] = in[j];
    else out[j] = in[i];
  }
}

// Rank i's row s of sample b (of 2c) is the sequence's position p: chunk i for s < c, else chunk 2 CP - 1 - i.
__global__ void sequence_order_kernel(uint16_t* out, const uint16_t* in, int64_t B, int64_t c, int64_t cp, int64_t width, bool to_ranks) {
  const int64_t R = 2 * c, n = cp * B * R * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t e = i % width, s = (i / width) % R, b = (i / (width * R)) % B, rank = i / (width * R * B);
    const int64_t chunk = s < c ? rank : 2 * cp - 1 - rank;
    const int64_t j = (b * cp * R + chunk * c + s % c) * width + e;
    if (to_ranks) out[i] = in[j];
    else out[j] = in[i];
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + 255) / 256, 1, 8192)); }

}  // namespace

void a2a_pack_heads(bf16* out, const bf16* in, const A2aShape& s, bool unpack, cudaStream_t stream) {
  if (s.cp < 1 || s.H % s.cp != 0) throw std::logic_error("a2a_pack_heads: the heads must divide over CP");
  const int64_t rows = s.B * 2 * s.c, n = rows * s.H * s.D;
  if (n == 0) return;
  pack_heads_kernel<<<blocks_for(n), 256, 0, stream>>>(reinterpret_cast<uint16_t*>(out), reinterpret_cast<const uint16_t*>(in), rows, s.H,
                                                       s.H / s.cp, s.D, unpack);
  MT_CUDA_CHECK(cudaGetLastError());
}

void a2a_sequence_order(bf16* out, const bf16* in, const A2aShape& s, bool to_ranks, cudaStream_t stream) {
  if (s.cp < 1 || s.H % s.cp != 0) throw std::logic_error("a2a_sequence_order: the heads must divide over CP");
  const int64_t width = s.H / s.cp * s.D, n = s.cp * s.B * 2 * s.c * width;
  if (n == 0) return;
  sequence_order_kernel<<<blocks_for(n), 256, 0, stream>>>(reinterpret_cast<uint16_t*>(out), reinterpret_cast<const uint16_t*>(in), s.B, s.c, s.cp,
                                                           width, to_ranks);
  MT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mt::cuda
