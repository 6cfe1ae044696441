// embedding.cu: gather and CSR scatter-add.
#include "kernels/cuda/embedding.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__global__ void embed_fwd(float* out, const int32_t* tokens, const float* wte, int64_t h, int64_t vstart, int64_t vlocal) {
  const int64_t t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(tokens[t]) - vstart;
  const bool mine = id >= 0 && id < vlocal;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) out[t * h + i] = mine ? wte[id * h + i] : 0.0f;
}

__global__ void embed_bwd(float* dwte, const float* dout, const int32_t* ids, const int32_t* offsets, const int32_t* positions,
                          int64_t h) {
  const int k = blockIdx.x;
  const int64_t row = ids[k];
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float s = 0;
    for (int p = offsets[k]; p < offsets[k + 1]; ++p) s += dout[static_cast<int64_t>(positions[p]) * h + i];
    dwte[row * h + i] += s;
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t T, int64_t h, int64_t vstart, int64_t vlocal,
                       cudaStream_t s) {
  if (T == 0) return;
  embed_fwd<<<static_cast<unsigned>(T), 256, 0, s>>>(out, tokens, wte, h, vstart, vlocal);
  MT_CUDA_CHECK_LAUNCH();
}

TokenCsr build_token_csr(const int32_t* tokens, int64_t T, int64_t vstart, int64_t vlocal) {
  // Counting sort by id: positions stay ascending within an id.
  std::vector<int32_t> count(static_cast<size_t>(vlocal) + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = tokens[t] - vstart;
    if (id >= 0 && id < vlocal) ++count[static_cast<size_t>(id)];
  }
  TokenCsr c;
  std::vector<int32_t> start(static_cast<size_t>(vlocal), -1);
  int32_t total = 0;
  for (int64_t v = 0; v < vlocal; ++v) {
    if (count[static_cast<size_t>(v)] == 0) continue;
    start[static_cast<size_t>(v)] = static_cast<int32_t>(c.ids.size());
    c.ids.push_back(static_cast<int32_t>(v));
    c.offsets.push_back(total);
    total += count[static_cast<size_t>(v)];
  }
  c.offsets.push_back(total);
  c.positions.resize(static_cast<size_t>(total));
  std::vector<int32_t> fill(c.offsets.begin(), c.offsets.end() - 1);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = tokens[t] - vstart;
    if (id < 0 || id >= vlocal) continue;
    const int32_t k = start[static_cast<size_t>(id)];
    c.positions[static_cast<size_t>(fill[static_cast<size_t>(k)]++)] = static_cast<int32_t>(t);
  }
  return c;
}

void embedding_backward(float* dwte, const float* dout, const int32_t* ids, const int32_t* offsets, const int32_t* positions,
                        int64_t n_ids, int64_t h, cudaStream_t s) {
  if (n_ids == 0) return;
  embed_bwd<<<static_cast<unsigned>(n_ids), 256, 0, s>>>(dwte, dout, ids, offsets, positions, h);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace mt::cuda
