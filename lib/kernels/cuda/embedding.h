// embedding.h (CUDA): token embedding lookup (vocab-parallel shard) and its deterministic backward.
// The backward walks a CSR of token positions per distinct id, built on the host from the microbatch
// (the tokens live there first), so every row's gradient is summed in one fixed order: no atomics.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace mt::cuda {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t T, int64_t h, int64_t vocab_start,
                       int64_t vocab_local, cudaStream_t stream);

struct TokenCsr {
  std::vector<int32_t> ids;        // distinct local row ids present in this shard
  std::vector<int32_t> offsets;    // ids.size() + 1 offsets into positions
  std::vector<int32_t> positions;  // token positions grouped by id, ascending within a group
};
TokenCsr build_token_csr(const int32_t* tokens, int64_t T, int64_t vocab_start, int64_t vocab_local);

// dwte[ids[k]] += sum of dout rows at positions[offsets[k]..offsets[k+1]) (device arrays).
void embedding_backward(float* dwte, const float* dout, const int32_t* ids, const int32_t* offsets, const int32_t* positions,
                        int64_t n_ids, int64_t h, cudaStream_t stream);

}  // namespace mt::cuda
