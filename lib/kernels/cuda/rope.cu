// rope.cu: one thread per (token, head, rotated pair).
#include <cmath>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/rope.h"
#include "kernels/rope_frequencies.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

// E: float, or a 16-bit type (computed in fp32, rounded once per element).
template <typename E>
__global__ void rope_kernel(E* x, const int32_t* pos, const float* table, int64_t T, int64_t H, int64_t d, int64_t half, float sign,
                            bool interleaved) {
  const int64_t total = T * H * half;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, th = k / half, t = th / H;
    const float c = table[(static_cast<int64_t>(pos[t]) * half + i) * 2];
    const float s = sign * table[(static_cast<int64_t>(pos[t]) * half + i) * 2 + 1];
    E* row = x + th * d;
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x1 = to_f(row[a]), x2 = to_f(row[b]);
    row[a] = from_f<E>(x1 * c - x2 * s);
    row[b] = from_f<E>(x2 * c + x1 * s);
  }
}

}  // namespace

std::vector<float> rope_table(int64_t max_pos, int64_t rot_dim, double base, const RopeScaling& scaling) {
  const int64_t half = rot_dim / 2;
  const std::vector<double> inv_freq = rope_inverse_frequencies(rot_dim, base, scaling);
  const double factor = rope_attention_factor(scaling);  // (YaRN's; 1 otherwise)
  std::vector<float> t(static_cast<size_t>(max_pos * half * 2));
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double ang = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
      t[static_cast<size_t>((p * half + i) * 2)] = static_cast<float>(factor * std::cos(ang));
      t[static_cast<size_t>((p * half + i) * 2 + 1)] = static_cast<float>(factor * std::sin(ang));
    }
  }
  return t;
}

void rope_apply(float* x, const int32_t* positions, const float* table, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float sign,
                cudaStream_t stream, bool interleaved) {
  const int64_t half = rot_dim / 2, total = T * H * half;
  if (total == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65535 * 4));
  rope_kernel<<<blocks, 256, 0, stream>>>(x, positions, table, T, H, d, half, sign, interleaved);
  MT_CUDA_CHECK_LAUNCH();
}

void rope_apply_16(bf16* x, const int32_t* positions, const float* table, int64_t T, int64_t H, int64_t d, int64_t rot_dim, float sign,
                   cudaStream_t stream, F16 t, bool interleaved) {
  const int64_t half = rot_dim / 2, total = T * H * half;
  if (total == 0) return;
  if (t == F16::kFP16) {
    rope_kernel<<<grid_for(total, 256), 256, 0, stream>>>(hp(x), positions, table, T, H, d, half, sign, interleaved);
  } else {
    rope_kernel<<<grid_for(total, 256), 256, 0, stream>>>(x, positions, table, T, H, d, half, sign, interleaved);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
