// embedding_bf16.cu: one thread per output element.
#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/embedding_bf16.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

template <typename T16>
__global__ void emb_kernel(float* out, const int32_t* tok, const int32_t* pos, const T16* wte, const T16* wpe, int64_t T, int64_t h, int64_t v0,
                           int64_t vn) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < T * h; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / h, c = e % h;
    const int64_t row = static_cast<int64_t>(tok[t]) - v0;
    float v = row >= 0 && row < vn ? to_f(wte[row * h + c]) : 0.0f;
    if (wpe) v += to_f(wpe[static_cast<int64_t>(pos[t]) * h + c]);
    out[e] = v;
  }
}

}  // namespace

template <typename T16>
void embedding_forward_bf16_t(float* out, const int32_t* tokens, const int32_t* positions, const T16* wte, const T16* wpe, int64_t T,
                            int64_t h, int64_t vocab_start, int64_t vocab_local, cudaStream_t stream) {
  if (T * h == 0) return;
  emb_kernel<<<grid_for(T * h, 256), 256, 0, stream>>>(out, tokens, positions, wte, wpe, T, h, vocab_start, vocab_local);
  MT_CUDA_CHECK_LAUNCH();
}

void embedding_forward_bf16(float* out, const int32_t* tokens, const int32_t* positions, const bf16* wte, const bf16* wpe, int64_t T, int64_t h, int64_t vocab_start, int64_t vocab_local, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) embedding_forward_bf16_t(out, tokens, positions, hp(wte), hp(wpe), T, h, vocab_start, vocab_local, stream);
  else embedding_forward_bf16_t(out, tokens, positions, wte, wpe, T, h, vocab_start, vocab_local, stream);
}

}  // namespace mt::cuda
