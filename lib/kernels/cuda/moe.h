// moe.h (CUDA): the MoE layer's kernels on the CUDA engine (16-bit activations, bf16 or fp16: the launchers' last
// argument, as bf16_fwd.h's; fp32 router math), computed as the
// CPU engine's kernels/cpu/router.cpp and model/cpu/moe_unit.cpp do: the router's logits, the top-k choice and
// weights (softmax after or before the choice, or sigmoid; scaled), the load-balancing scores and counts, the
// deterministic permutation of the choices into expert-major rows (each expert's rows in token order), the
// gather and the weighted combine, and each one's backward. Every sum runs in a fixed order (no float atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_fwd.h"
#include "tensor/rng.h"  // MT_HD

namespace mt::cuda {

struct MoeRouting {
  int64_t tokens = 0, experts = 0, topk = 1, hidden = 0;
  bool sigmoid = false, pre_softmax = false;  // sigmoid: an element-wise score (sigmoid, or sqrtsoftplus below) normalised over the chosen
  float scaling = 1.0f;
  int64_t num_groups = 0, group_topk = 0;  // group-limited routing (Megatron's group_limited_topk; 0: off)
  // The load-balancing loss per sequence of seq_len tokens (seq_aux_loss), averaged over the micro batch's sequences;
  // 0: over the micro batch's tokens (aux_loss).
  int64_t seq_len = 0;
  // The ranks holding shares of the microbatch's sequences (context parallelism; 1 otherwise): the balance and z losses
  // count all their tokens (the statistics summed over them between moe_aux_stats and moe_balance_finish / moe_stats_finish).
  int64_t shards = 1;
  // Each expert's first row a multiple of this (FP8 experts: 16, the FP8 GEMMs' granule; the rows between an expert's
  // last and the next one's first are no choice's, the caller's to zero). 1: back to back.
  int64_t row_align = 1;
  // --moe-router-score-function sqrtsoftplus (with sigmoid set): sqrt(softplus(x)) as the element-wise score.
  bool sqrtsoftplus = false;
  MT_HD int64_t balance_groups() const { return seq_len > 0 ? tokens / seq_len : 1; }  // the sequences (aux_loss: 1)
  MT_HD int64_t balance_len() const { return seq_len > 0 ? seq_len : tokens; }          // (this rank's tokens of each)
};

// A layer's row of statistics (CudaGPT::moe_stats): the three load-balancing losses without their coefficients
// (config.h's kAuxLossTypes' order: aux_loss, seq_aux_loss, global_aux_loss), the z-loss's mean lse^2, then the tokens
// each of the E experts kept.
inline constexpr int64_t kMoeStatsHead = 4;

// logits[T, E] (fp32) = xn[T, h] w[E, h]^T, accumulated in fp32.
void moe_router_logits(float* logits, const bf16* xn, const bf16* w, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16);
// --moe-router-dtype fp64: the same products (and the bias b[E], may be null) summed in double, rounded to fp32 once.
void moe_router_logits_fp64(float* logits, const bf16* xn, const bf16* w, const bf16* b, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16);
// --moe-router-force-load-balancing: logits[T, E] replaced by model/moe_random_logits.h's standard normal values for the
// T rows of whole sequences of seq_length (row t: sample first_sample + t / seq_length, position t % seq_length) in
// global layer `layer`, as the CPU engine draws them.
void moe_random_logits(float* logits, const MoeRouting& r, uint64_t key, int64_t layer, int64_t first_sample, int64_t seq_length, cudaStream_t st);
// --moe-input-jitter-eps: the noise of model/moe_input_jitter.h for T rows of whole sequences of seq_length (row t:
// sample first_sample + t / seq_length, position t % seq_length) in global layer `layer`, as the CPU engine draws it.
struct MoeJitter {
  uint64_t key = 0;
  float eps = 0;
  int64_t layer = 0, first_sample = 0, seq_length = 1;
};
// out[T, h] = xn[T, h] times each element's noise factor (the router's input; the experts take xn).
void moe_jitter_router_input(bf16* out, const bf16* xn, const MoeRouting& r, const MoeJitter& j, cudaStream_t st, F16 dt = F16::kBF16);
// top[T, k] (descending, ties to the lower expert; with groups, among the experts of the best group_topk groups, each
// group scored by the sum of its best topk / group_topk scores) and weight[T, k]. expert_bias (E floats, may be null:
// --moe-router-enable-expert-bias) is added to the scores for the choice only, not the weights.
// choice (T x E, may be null: sinkhorn routing in training) replaces the scores for the choice; the weights stay the scores'.
void moe_route(int32_t* top, float* weight, const float* logits, const MoeRouting& r, cudaStream_t st, const float* expert_bias = nullptr,
               const float* choice = nullptr);
// --moe-router-load-balancing-type sinkhorn (training): out[T, E] = the Sinkhorn-normalised logits[T, E] of
// kernels/cpu/router.h's sinkhorn_normalize (one block; the same updates and stopping rule in fp32, the sums over
// tokens in a fixed warp order); scratch: T (E + 1) floats (the costs expert-major, then the per-token factors).
void moe_sinkhorn(float* out, float* scratch, const float* logits, const MoeRouting& r, cudaStream_t st);
// Aux-loss-free balancing after a step (Megatron's get_updated_expert_bias), for `layers` MoE layers: each layer's
// bias[E] += rate x sign(mean count - count[e]), the counts being the tokens each expert kept over the iteration:
// acc[l (kMoeStatsHead + E) + kMoeStatsHead + e] (moe_stats_finish's statistics).
void moe_update_expert_bias(float* bias, const float* acc, int64_t layers, int64_t E, float rate, cudaStream_t st);
// The choices' rows: counts[E] per expert, offsets[E + 1], row[T * k] (expert-major, each expert's choices in
// token order, each expert's first row a multiple of r.row_align); parts: moe_permute_scratch(r) ints.
void moe_permute(int32_t* row, int32_t* counts, int32_t* offsets, int32_t* parts, const int32_t* top, const MoeRouting& r, cudaStream_t st);
int64_t moe_permute_scratch(const MoeRouting& r);
// rows[row[t k + j]] = xn[t]. Here and below a row of -1 is a choice the capacity dropped: no row, weight 0.
// row_weight (not null: --moe-apply-probs-on-input): each row is its slot's weight times the token's row, rounded once.
void moe_gather(bf16* rows, const bf16* xn, const int32_t* row, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16,
                const float* row_weight = nullptr);
// --moe-pad-expert-input-to-capacity: the padding rows of n pairs map[2 i] = row, map[2 i + 1] = token (tokens an
// expert does not route to, weight 0): rows[row] = xn[token], or zeros where xn is null (their output gradients).
void moe_pad_rows(bf16* rows, const bf16* xn, const int32_t* map, int64_t n, int64_t h, cudaStream_t st, F16 dt = F16::kBF16);
// out[t] = sum_j weight[t, j] y[row[t k + j]] (fp32 sums, in slot order).
void moe_combine(bf16* out, const bf16* y, const int32_t* row, const float* weight, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16);
// dy_rows[row] = weight x dout[t]; dweight[t, j] = <y[row], dout[t]>.
void moe_combine_backward(bf16* dy_rows, float* dweight, const bf16* dout, const bf16* y, const int32_t* row, const float* weight, const MoeRouting& r,
                          cudaStream_t st, F16 dt = F16::kBF16);
// The load-balancing statistics of the aux loss: scores[T, E] (softmax, or sigmoid normalised over the experts),
// counts_aux[G, E] of a plain top-k of them, probsum[G, E] (in token order), G = r.balance_groups() (the sequences
// under seq_aux_loss, else 1), and the z-loss's sum of lse^2 into z[0].
void moe_aux_stats(float* scores, float* counts_aux, float* probsum, float* z, const float* logits, const MoeRouting& r, cudaStream_t st);
// One load-balancing loss type per layer and microbatch, from its statistics (under context parallelism summed over the
// r.shards ranks first; G = r.balance_groups() groups of n tokens over every shard): its gradient per score,
// coeff E / (k n^2 G) counts_aux[g, e], into dscale[dscale_groups, E] (written, or with `add` added; a batch-level
// type's one row (G 1) enters every row, a seq_aux_loss's group g row g), and unless value is null value[0] += the loss
// without its coefficient (the sum over the groups of E / (k n^2 G) sum_e probsum counts_aux).
// global (global_aux_loss; null otherwise): the layer's running [E + 1] over the iteration's microbatches (the aux
// counts summed, then how many microbatches), which the loss and its gradient use averaged in place of this
// microbatch's counts; `accumulate` (a training forward, not a recompute or evaluation) adds this microbatch first.
void moe_balance_finish(float* dscale, int64_t dscale_groups, bool add, float* value, const float* counts_aux, const float* probsum, float coeff,
                        const MoeRouting& r, cudaStream_t st, float* global = nullptr, bool accumulate = false);
// The rest of a training forward's row (kMoeStatsHead + E floats at acc): acc[3] += mean lse^2 (z, over every shard's
// tokens; with zloss), acc[4 + e] += the tokens expert e kept on this rank (counts).
void moe_stats_finish(float* acc, const float* z, const int32_t* counts, bool zloss, const MoeRouting& r, cudaStream_t st);
// dlogits[T, E] (overwritten) = the top-k backward of dweight + grad_scale x (the aux scores' backward of dscale, and
// z_coeff / (T shards) x d(lse^2)) where those are on (dscale null: no aux loss; z_coeff 0: none); under fp16 that
// grad_scale times the device-side loss scale (loss_scale, null in bf16), as the lm loss's gradient carries it.
void moe_router_backward(float* dlogits, const float* logits, const int32_t* top, const float* dweight, const float* dscale, float z_coeff,
                         float grad_scale, const MoeRouting& r, cudaStream_t st, const float* loss_scale = nullptr);
// dxn[t] = sum_j drows[row[t k + j]] + sum_e dlogits[t, e] w[e] (overwritten, 16-bit).
// row_weight (not null: --moe-apply-probs-on-input): each row's gradient enters its token's times the slot's weight.
// jitter (not null: --moe-input-jitter-eps): the router's term times each element's noise factor (the router read xn
// times it).
void moe_input_backward(bf16* dxn, const bf16* drows, const int32_t* row, const float* dlogits, const bf16* w, const MoeRouting& r, cudaStream_t st,
                        F16 dt = F16::kBF16, const float* row_weight = nullptr, const MoeJitter* jitter = nullptr);
// dw[E, h] += dlogits^T xn (fp32, the tokens in 64 parts summed in order); partial: moe_router_wgrad_scratch floats.
void moe_router_wgrad(float* dw, float* partial, const float* dlogits, const bf16* xn, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16);
int64_t moe_router_wgrad_scratch(const MoeRouting& r);
// --add-bias-linear: logits[T, E] += b[E] (after either logits path, in fp32), and its gradient db[E] += the column sums
// of dlogits (per expert in a fixed order).
void moe_router_bias(float* logits, const bf16* b, const MoeRouting& r, cudaStream_t st, F16 dt = F16::kBF16);
void moe_router_bias_grad(float* db, const float* dlogits, const MoeRouting& r, cudaStream_t st);
// --moe-shared-expert-gate, a warp per token: gate[t] = sigmoid(xn[t] . w) (fp32, the products summed over the lanes'
// strided parts by shuffles) and delta[t] += gate[t] shared[t] (shared in 16 bits, the sum rounded to them), for T tokens.
void moe_shared_gate_forward(float* gate, bf16* delta, const bf16* shared, const bf16* xn, const bf16* w, int64_t T, int64_t h,
                             cudaStream_t st, F16 dt = F16::kBF16);
// Its backward: dshared[t] = gate[t] dy[t] (the shared expert's output gradient) and dlogit[t] = (dy[t] . shared[t])
// gate (1 - gate) (under TP a partial sum with this rank's share of the shared output, as the weight's and input's
// gradients it feeds are); dxn[t] += dlogit[t] w (rounded to 16 bits). The weight's gradient: moe_router_wgrad with one expert.
void moe_shared_gate_backward(bf16* dshared, float* dlogit, bf16* dxn, const bf16* dy, const bf16* shared, const float* gate, const bf16* w,
                              int64_t T, int64_t h, cudaStream_t st, F16 dt = F16::kBF16);

}  // namespace mt::cuda
