// router.h: the MoE router's math on the CPU reference engine, as Megatron-Core computes it
// (moe_utils.topk_softmax_with_capacity, compute_routing_scores_for_aux_loss, the load-balancing and z losses):
// top-k over the scores (softmax after or before the choice, or sigmoid; group-limited; an expert bias that
// steers the choice only), the routing weights, capacity dropping, and each one's backward. Dense [n, E] maps
// as Megatron keeps them. Ties go to the lower expert index (and, when dropping, to the earlier token), so a
// choice is the same on every rank and layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt::cpu {

// --moe-router-score-function: softmax (over the chosen, or over all experts with pre_softmax), or a score per expert
// (sigmoid, or sqrtsoftplus: sqrt(softplus(x)), DeepSeek-V4's), normalised over the chosen at top-k > 1.
enum class ScoreFunction { kSoftmax, kSigmoid, kSqrtSoftplus };
ScoreFunction score_function_named(const std::string& name);  // "softmax" | "sigmoid" | "sqrtsoftplus"

struct RouterSettings {
  int64_t experts = 0, topk = 1;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool pre_softmax = false;  // --moe-router-pre-softmax: softmax over all experts, then the top k
  float scaling = 1.0f;      // --moe-router-topk-scaling-factor
  int64_t num_groups = 0, group_topk = 0;  // group-limited routing (0: off)
};

// The top-k choice of n tokens: top[n, k] expert indices (descending score, ties to the lower index) and their
// routing weights weight[n, k]. expert_bias (E values, may be null) is added to the scores for the choice only.
// choice (n x E values, may be null: --moe-router-load-balancing-type sinkhorn in training) replaces the scores for the
// choice; the weights stay the scores'.
void route_topk(const RouterSettings& s, const float* logits, const float* expert_bias, int64_t n, int32_t* top, float* weight,
                const float* choice = nullptr);

// Megatron's sinkhorn (moe_utils.sinkhorn, S-BASE's balancing): cost = exp(logits[n, E]) scaled by a factor per token
// d0[n] and per expert d1[E], alternately d0 = 1/n / (cost d1 + eps) and d1 = 1/E / (d0 cost + eps), until the mean
// change of d1 is at most 1e-4 (at most kSinkhornMaxIterations rounds); returns d1 cost d0, n x E, in fp32 as
// Megatron's. Its top-k is the training's choice (router.cpp's sinkhorn_load_balancing).
constexpr int kSinkhornMaxIterations = 10000;
std::vector<float> sinkhorn_normalize(const float* logits, int64_t n, int64_t experts);
// Megatron's quantile balancing (moe_utils.qb_dual_update), in two halves around the gather of a microbatch's tokens:
// choice[n, E] = logits - beta (the routing's choice: its top k), and shifted[n, E] = logits - alpha, alpha each token's
// (k + 1)-th largest choice score; then over the microbatch's m gathered rows of shifted, quantile[E] = each column's
// (m k / E + 1)-th largest value (m k must be a multiple of E, k below E).
void quantile_choice_scores(const float* logits, const float* beta, int64_t n, int64_t experts, int64_t topk, float* choice, float* shifted);
void column_quantiles(const float* shifted, int64_t m, int64_t experts, int64_t topk, float* quantile);

// dlogits[n, E] (overwritten) from the gradient of the routing weights dweight[n, k].
void route_topk_backward(const RouterSettings& s, const float* logits, const int32_t* top, const float* dweight, int64_t n, float* dlogits);

// Megatron's get_capacity: ceil(tokens * topk / experts * factor).
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t topk, int64_t experts);
// Which of n tokens' top-k choices fit their expert's capacity: keep[n, k]. by_probability (--moe-token-drop-policy
// probs) keeps each expert's highest weights (ties: the earlier token), else the earliest tokens (position).
// "Earlier" is Megatron's token order, sequence position first ([S, B] flattened): `order` lists the n tokens
// in it (megatron_token_order for B whole sequences in batch-major rows).
void capacity_keep(const int32_t* top, const float* weight, const std::vector<int64_t>& order, int64_t topk, int64_t experts, int64_t capacity,
                   bool by_probability, uint8_t* keep);
// The n = B x seq_length batch-major rows (t = b * seq_length + s) in the order (s, b).
std::vector<int64_t> megatron_token_order(int64_t n, int64_t seq_length);
// --moe-pad-expert-input-to-capacity: the tokens each expert receives when padded to `capacity`: its kept
// tokens, then the tokens it does not route to (their weight 0) in Megatron's token order (as capacity_keep),
// at most n. pad[e] lists the extra tokens of expert e.
std::vector<std::vector<int64_t>> capacity_padding(const int32_t* top, const uint8_t* keep, const std::vector<int64_t>& order, int64_t topk,
                                                   int64_t experts, int64_t capacity);

// The experts' rows of n tokens' choices as the CUDA engine lays them out on the host (CudaGPT::moe_capacity):
// expert-major, each expert's rows in token order with its padding tokens (pads[e], from capacity_padding; may be
// empty: none) placed among its kept ones by token, each expert's block starting at a multiple of `align` (FP8: 16).
// Only the tokens in [first, last) take rows (a TP rank's slice, with expert-TP other than TP). row[n k]: the choice's
// row (-1: dropped, or another slice's token); per_expert[E]: the rows (pads included); pad_map: (row, token) pairs.
struct ExpertRows {
  std::vector<int32_t> row, per_expert, pad_map;
};
ExpertRows place_expert_rows(const int32_t* top, const uint8_t* keep, const std::vector<std::vector<int64_t>>& pads, int64_t n, int64_t topk,
                             int64_t experts, int64_t first, int64_t last, int64_t align);

// The scores the load-balancing losses use (compute_routing_scores_for_aux_loss): softmax over all experts, or
// sigmoid (sqrtsoftplus) normalised to sum 1 per token; and the top-k of them (no bias, no groups, no capacity): counts[E] += .
void aux_scores(const float* logits, int64_t n, int64_t experts, ScoreFunction score, float* scores);
void aux_topk_counts(const float* scores, int64_t n, int64_t experts, int64_t topk, double* counts);
// dlogits[n, E] += the gradient through aux_scores of dscores[n, E].
void aux_scores_backward(const float* logits, const float* dscores, int64_t n, int64_t experts, ScoreFunction score, float* dlogits);

// z-loss: returns sum over the n tokens of logsumexp(logits)^2; dlogits += scale * d/dlogits of that sum.
double z_loss_sum(const float* logits, int64_t n, int64_t experts);
void z_loss_backward(const float* logits, int64_t n, int64_t experts, float scale, float* dlogits);

}  // namespace mt::cpu
