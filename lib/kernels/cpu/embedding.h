// embedding.h: token (+ learned position) embedding, forward and backward. The token table may be a
// vocab-parallel shard holding rows [vocab_start, vocab_start + vocab_local): other ids give zeros
// (the TP all-reduce sums the shards).
#pragma once
#include <cstdint>

namespace mt::cpu {

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                       int64_t T, int64_t h, int64_t vocab_start, int64_t vocab_local);
// Accumulates into dwte (and dwpe when given).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                        int64_t T, int64_t h, int64_t vocab_start, int64_t vocab_local);

}  // namespace mt::cpu
