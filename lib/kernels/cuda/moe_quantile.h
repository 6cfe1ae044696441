// moe_quantile.h (CUDA): --moe-router-load-balancing-type quantile_balancing on the CUDA engine (Megatron's QB:
// router.quantile_balancing, moe_utils.qb_dual_update), computed as the CPU engine's kernels/cpu/router.h
// (quantile_choice_scores, column_quantiles) and GPTModel::update_quantile_biases: the choice scores, each expert's
// quantile of a microbatch (an exact selection, no float sums), and the bias's update once per iteration.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/moe.h"

namespace mt::cuda {

// choice[T, E] = logits - beta (fp32: the routing's choice, moe_route's choice argument) and, unless shifted is null
// (evaluation), shifted[T, E] = logits - alpha, alpha each token's (k + 1)-th largest choice score.
void moe_quantile_scores(float* choice, float* shifted, const float* logits, const float* beta, const MoeRouting& r, cudaStream_t st);
// Over the T rows of shifted (the microbatch's tokens), each expert's (T k / E + 1)-th largest value, selected exactly
// (a radix selection on the floats' ordered bits), added to acc[e]; acc[E] += 1 (the microbatches counted). T k must
// be a multiple of E and k below E (the configuration's checks).
void moe_quantile_accumulate(float* acc, const float* shifted, const MoeRouting& r, cudaStream_t st);
// Once per iteration (Megatron's _update_router_qb_beta), for `layers` MoE layers of E experts: each layer's
// beta[E] = ema beta + (1 - ema) mean, mean = acc's sums over its count (both summed over the data-parallel replicas
// first: every replica counts the same microbatches, so this is the replicas' average of their means), then re-centred
// to mean 0, in double and in the CPU engine's order; acc [layers (E + 1)] zeroed for the next iteration. (The sums are
// fp32, where the CPU engine's are double: with several microbatches qb_beta may differ from its in the last bit.)
void moe_update_quantile_bias(float* beta, float* acc, int64_t layers, int64_t E, double ema, cudaStream_t st);

}  // namespace mt::cuda
