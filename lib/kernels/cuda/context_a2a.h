// context_a2a.h (CUDA): the layouts of context parallelism's all-to-all attention (--cp-comm-type a2a, DeepSpeed's
// Ulysses as Megatron runs it with Transformer Engine). Each CP rank holds 2c rows of every sample (chunks r and
// 2 CP - 1 - r of the sequence, model/context_parallel.h) with all of its H heads; an all-to-all gives every rank all
// S = 2 c CP rows of H / CP of the heads. These kernels pack a rank's rows head group by head group for the all-to-all
// and put the received rows back in the sequence's order (and the reverse), 16-bit elements.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"

namespace mt::cuda {

struct A2aShape {
  int64_t B = 0, c = 0, cp = 1, H = 0, D = 0;  // samples, the chunk length, CP, this rank's heads (before), head dim
};

// out [cp][B 2c][H / cp][D] = in [B 2c][H][D], head group j for rank j; unpack: the reverse.
void a2a_pack_heads(bf16* out, const bf16* in, const A2aShape& s, bool unpack, cudaStream_t stream);
// out [B][S][H / cp][D] in the sequence's order from in [cp][B 2c][H / cp][D] (rank i's rows: its chunks i and
// 2 CP - 1 - i of each sample); to_ranks true: the reverse.
void a2a_sequence_order(bf16* out, const bf16* in, const A2aShape& s, bool to_ranks, cudaStream_t stream);

}  // namespace mt::cuda
