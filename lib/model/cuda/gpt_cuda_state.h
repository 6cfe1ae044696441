// gpt_cuda_state.h: the CUDA model's private structures (each layer's parameter offsets, its activation
// record, the shared scratch buffers), shared by the files that implement CudaGPT. Not for other users.
#pragma once

#include <vector>

#include "model/cuda/gpt_cuda.h"
#include "tensor/cuda/growing_buffer.h"

namespace mt {

using cuda::bf16;
// cuBLASLt's type of an FP8 operand.
inline cudaDataType_t fp8_data_type(cuda::Fp8Type t) { return t == cuda::Fp8Type::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }
struct CudaGPT::LayerW {
  int64_t ln1_w = -1, ln1_b = -1, qkv_w = -1, qkv_b = -1, proj_w = -1, proj_b = -1;
  int64_t ln2_w = -1, ln2_b = -1, fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
  int64_t qn_w = -1, qn_b = -1, kn_w = -1, kn_b = -1;  // --qk-layernorm
  int64_t sink = -1;                                    // --softmax-type learnable: the heads' sink logits [nh_local]
  // --multi-latent-attention (gpt_cuda_mla.cpp): the query projection (without --q-lora-rank) or its down projection,
  // latent norm and up projection; the keys' and values' down projection [kv_lora_rank + dr, h] (the latent's rows, then
  // k_pe's), latent norm and up projection (-1: none).
  int64_t q_proj_w = -1, q_down_w = -1, q_ln_w = -1, q_ln_b = -1, q_up_w = -1, kv_down_w = -1, kv_ln_w = -1, kv_ln_b = -1, kv_up_w = -1;
  // An MoE layer: the router [E, h] and each expert's fc1 ([2F, h] with SwiGLU: gate and up) and fc2 [h, F], and with
  // --add-bias-linear their biases (the router's [E], each expert's fc1 [2F] and fc2 [h]; -1: none).
  bool moe = false;
  int64_t router_w = -1, router_b = -1;
  std::vector<int64_t> expert_fc1, expert_fc2, expert_fc1_b, expert_fc2_b;
  int64_t shared_fc1_w = -1, shared_fc2_w = -1;  // the shared expert (--moe-shared-expert-intermediate-size; -1: none)
  int64_t shared_gate_w = -1;                     // its gate (--moe-shared-expert-gate; -1: none)
  int64_t moe_index = -1;  // its place among the stage's MoE layers (the statistics' rows)
};

struct CudaGPT::Record {
  void* x_in = nullptr;  // the layer's input (the residual stream: 16-bit, or fp32 with --fp32-residual-connection)
  void* x_mid = nullptr;  // the residual stream after the attention block
  bf16 *xn1 = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *xn2 = nullptr, *fc1 = nullptr, *act = nullptr;
  float *mean1 = nullptr, *rstd1 = nullptr, *stats = nullptr, *mean2 = nullptr, *rstd2 = nullptr;
  // --qk-layernorm: the query and key heads before their norm, and its statistics per (token, head).
  bf16 *q_pre = nullptr, *k_pre = nullptr;
  float *qn_mean = nullptr, *qn_rstd = nullptr, *kn_mean = nullptr, *kn_rstd = nullptr;
  // --multi-latent-attention: the query latent [T, q_lora_rank] and the key / value latent [T, kv_lora_rank] before
  // their norms (*_in) and after them (*_lat: the same buffer without --qk-layernorm), and the norms' statistics.
  bf16 *mla_q_in = nullptr, *mla_q_lat = nullptr, *mla_kv_in = nullptr, *mla_kv_lat = nullptr;
  float *mla_q_mean = nullptr, *mla_q_rstd = nullptr, *mla_kv_mean = nullptr, *mla_kv_rstd = nullptr;
  bf16* mla_k_pe = nullptr;  // --recompute-modules mla_up_proj: the shared RoPE key, rotated [T, dr] (null: not recomputed)
  // MoE (the model has MoE layers): the router's logits [T, E], the choices top [T, k] with their weights and rows
  // [T, k], the experts' rows (expert-major) [R, h], fc1 outputs [R, F1], activations [R, F], outputs [R, h] (R = T k, or
  // with padding to capacity at most E capacity),
  // the aux loss's gradient per score [E], and the rows per expert (host, from the forward).
  float *logits = nullptr, *route_weight = nullptr, *aux_dscale = nullptr;
  int32_t *top = nullptr, *row = nullptr;
  bf16 *ex_rows = nullptr, *ex_fc1 = nullptr, *ex_act = nullptr, *ex_out = nullptr;
  std::vector<int32_t> per_expert;
  // Expert parallelism (gpt_cuda_expert_parallel.cpp): ex_rows and ex_out hold this rank's choices in owner order (every
  // expert's, expert-major) and per_expert the rows of this rank's experts; their rows, fc1 outputs and activations
  // (received from every EP rank, expert-major, each expert's in source-rank order) grow with what arrives. ep_from[s][j]:
  // the rows EP rank s sent to local expert j; ep_send / ep_recv: the elements sent to and received from each EP rank.
  GrowingBuffer ep_rows, ep_fc1, ep_act;
  std::vector<std::vector<int64_t>> ep_from;
  std::vector<int64_t> ep_send, ep_recv;
  // FP8 under EP: the rows this rank routed per expert (owner order; each expert's block padded to 16 rows, and the
  // padded blocks travel, so that every expert's rows on the receiving rank stay 16-aligned), and the routed experts'
  // x^T and block scales for the rows that arrive (ex_f8_xt's part; they grow with them).
  std::vector<int32_t> owner_per_expert;
  GrowingBuffer ep_f8_xt[2], ep_f8_xt_scale[2];
  // Expert-TP other than TP, over an expert-TP group of more than one rank (gpt_cuda_expert_tensor_parallel.cpp): the
  // rows gathered from every expert-TP rank (expert-major, each expert's in rank order), etp_counts[q][j] the rows rank
  // q brought to local expert j, etp_block the rows of each rank's block in the gather (the most any rank has), and
  // local_rows this rank's own (before the gather).
  GrowingBuffer etp_rows;
  std::vector<std::vector<int64_t>> etp_counts;
  int64_t etp_block = 0, local_rows = 0;
  // --moe-pad-expert-input-to-capacity: the padding rows' (row, token) pairs (moe_pad_rows) and how many.
  int32_t* pad_map = nullptr;
  int64_t pads = 0;
  // The shared expert (every token): its fc1 output [T, F1s] and activation [T, Fs].
  bf16 *sh_fc1 = nullptr, *sh_act = nullptr;
  bf16* sh_out = nullptr;      // --moe-shared-expert-gate: the shared expert's ungated output [T, h] (under TP its partial sums)
  float* sh_gate = nullptr;    // and each token's gate [T]
  // FP8 layers: per linear site, the amax of its input and of its weight from the forward [4 x 2] (the backward
  // casts the weight's transpose with the same scale), the input's transpose x^T in FP8 that the forward's cast wrote
  // beside x (the weight gradient's operand: [h, T], [Hd, T], [h, T], [F, T]) and the inverse scales they carry
  // (f8_xinv + 64 site: 256 bytes apart, as cuBLASLt assumes of its scale pointers).
  float* f8_amax = nullptr;
  uint8_t* f8_xt[4] = {};
  float* f8_xinv = nullptr;
  float* f8_xt_scale[4] = {};  // blockwise: x^T's inverse scales per 128 tokens of a feature (kernels/cuda/fp8_block.h)
  // FP8 MoE layers (gpt_cuda_moe_fp8.cpp): the routed experts' fc1 and fc2 inputs transposed, expert e's [in, n_e] from
  // byte off_e x in ([h, R] and [Fm, R] in all), the shared expert's ([h, T], [Fs, T]), their inverse scales (tensorwise:
  // 64 floats per expert and site, the shared expert's last) or x^T's block scales (blockwise).
  uint8_t *ex_f8_xt[2] = {}, *sh_f8_xt[2] = {};
  float* ex_f8_xinv = nullptr;
  float *ex_f8_xt_scale[2] = {}, *sh_f8_xt_scale[2] = {};
};

// [T, .] unless marked [Tl, .]; the *_l buffers exist under sequence parallelism only.
struct CudaGPT::Scratch {
  bf16 *q_all = nullptr /*[T, qh_local * d]: K/V replication only*/, *qkv = nullptr, *delta = nullptr, *xnf = nullptr, *logits = nullptr, *dres16 = nullptr /*[Tl]*/, *dxn = nullptr;
  bf16 *d_o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dact = nullptr, *dfc1 = nullptr;
  bf16 *delta_l = nullptr, *xn_l = nullptr, *dxn_l = nullptr, *dres16_full = nullptr;
  void* x_final = nullptr;  // [Tl], the residual stream's type
  float *meanf = nullptr, *rstdf = nullptr, *losses = nullptr, *dres = nullptr /*[Tl]*/;
  float *emb = nullptr /*[T, h] fp32: the embedding's sum (SP or a 16-bit residual) and SP's gradient gather*/, *ce_stats = nullptr /*[4T]: vocab-parallel loss*/;
  bf16 *dq_pre = nullptr, *dk_pre = nullptr;  // --qk-layernorm: the heads' gradients before their norm
  float* qk_tmp = nullptr;                     // --qk-layernorm: [T, Hd] fp32 scratch of the norm backward
  float* sink32 = nullptr;                     // --softmax-type: the layer's sink logits in fp32 [nh_local] (off-by-one: zeros)
  // --multi-latent-attention: the key / value up projection's output [T, nh_local (dn + dv)] and the shared RoPE key
  // [T, dr] (the backward: their gradients), a latent's gradient after and before its norm [T, max rank], and the norm
  // backward's fp32 scratch [T, max rank].
  bf16 *mla_kv = nullptr, *mla_k_pe = nullptr, *mla_dlat = nullptr, *mla_dlat_in = nullptr;
  float* mla_tmp = nullptr;
  float* bgrad = nullptr;  // [2, max(Wq, F1, h)], models with biases: a bias gradient from a weight-gradient GEMM's epilogue, per stream
  float* norm_part = nullptr;  // the split TP backward: its norms' weight-gradient partial sums (on tp_stream_)
  int32_t* half_pos = nullptr;  // the split layers under SP: the positions in half-major row order [T]
  bf16* parts = nullptr;  // the split layers under SP: each half's all-to-all of the ranks' partial sums of this rank's piece [T, h]
  // MoE: the experts' output and input gradients [T k, .], the router's [T, E] and the weights' [T, k], the aux
  // statistics (scores [T, E], counts, score sums, the z-loss's sum then each token's lse^2 [1 + T]), the rows per
  // expert and their offsets, and a pinned host copy of the counts.
  bf16 *ex_dout = nullptr, *ex_dact = nullptr, *ex_dfc1 = nullptr, *ex_din = nullptr;
  bf16 *sh_dact = nullptr, *sh_dfc1 = nullptr;
  bf16* sh_dgated = nullptr;   // --moe-shared-expert-gate: the shared expert's output gradient [T, h]
  float* sh_dlogit = nullptr;  // and the gate logits' [T]  // the shared expert's activation [T, Fs] and fc1 [T, F1s] gradients
  float *dlogits = nullptr, *dweight = nullptr, *scores = nullptr, *probsum = nullptr, *zsum = nullptr;
  bf16* router_input = nullptr;  // --moe-input-jitter-eps: the router's input, the norm output times its noise [T, h]
  float* sinkhorn = nullptr;  // sinkhorn routing: the normalised logits [T, E], then the kernel's scratch [T (E + 1)]
  // quantile_balancing: logits - alpha [T, E] in a training forward (scores holds the choice, logits - qb_beta, before
  // the route kernel reads it)
  float* quantile_shifted = nullptr;
  float* counts_aux = nullptr;
  // seq_aux_loss beside a batch-level type (aux_loss, global_aux_loss): that type's statistics over the microbatch [E]
  // (counts_aux and probsum then hold the per-sequence ones).
  float *counts_aux_batch = nullptr, *probsum_batch = nullptr;
  int32_t *counts = nullptr, *offsets = nullptr, *counts_host = nullptr;
  float* wgrad_parts = nullptr;  // the router weight gradient's partial sums
  // Expert parallelism: the rows in transit (source-rank-major), this rank's experts' outputs, output gradients, input
  // gradients and activation / fc1 gradients (expert-major), and the counts per expert sent and received [2E] (with
  // counts_host holding 2E then).
  GrowingBuffer ep_transit, ep_out, ep_dout, ep_din, ep_dact, ep_dfc1;
  GrowingBuffer ep_act_shared;  // (the experts' activations of the layers that share them: CudaGPT::expert_act_shared)
  int32_t* ep_counts = nullptr;
  // Expert-TP's gather: every rank's block of rows in transit, the gathered rows' outputs or output gradients, their
  // input gradients, and the counts per local expert gathered [(expert-TP + 1) x local experts] (the host's in a pinned
  // copy of its own).
  GrowingBuffer etp_transit, etp_out, etp_dout, etp_din;
  int32_t *etp_counts = nullptr, *etp_counts_host = nullptr;
  int32_t* permute_parts = nullptr;  // the permutation's counts, then first rows, per chunk of choices and expert
  // FP8 layers: an FP8 operand [T, widest] (the forward's input, the backward's dy), dy^T for the weight gradient,
  // and the scalars f8_scalar(i) (256 bytes apart, the alignment cuBLASLt assumes of its scale pointers): 2 dy's
  // amax, 3 dy's inverse scale.
  uint8_t *f8_row = nullptr, *f8_dyt = nullptr;
  float* f8_scalars = nullptr;
  // Blockwise: the inverse scales of f8_row (1 x 128 blocks along its rows) and f8_dyt (128 tokens of a feature).
  float *f8_row_scale = nullptr, *f8_dyt_scale = nullptr;
  float* f8_scalar(int i) const { return f8_scalars + 64 * i; }
  // FP8 MoE layers: the experts' row-major FP8 operands and dy^T (each expert's share from its first row), their block
  // scales (blockwise), and each expert's scalars (tensorwise: 3 x 64 floats, the shared expert's last).
  uint8_t *ex_f8_row = nullptr, *ex_f8_dyt = nullptr;
  float *ex_f8_row_scale = nullptr, *ex_f8_dyt_scale = nullptr, *ex_f8_scalars = nullptr;
  // ... and under EP the routed experts' (ex_f8_row's, ex_f8_dyt's and their scales' part), for the rows that arrive.
  GrowingBuffer ep_f8_row, ep_f8_dyt, ep_f8_row_scale, ep_f8_dyt_scale;
  // Context parallelism (ring attention, gpt_cuda_context.cpp): the merged output's fp32 accumulator [T, Hd], two
  // buffers of the K/V block coming round the ring [2][T, 2 KVd] (keys, then values), the queries' fp32 gradient
  // [T, Hd], two buffers of the K/V gradients travelling with their block [2][T, 2 KVd] fp32, and one block's
  // scratch (its 16-bit output and gradients, its log-sum-exp [T, heads]).
  float *ring_acc = nullptr, *ring_dq = nullptr, *ring_dkv[2] = {};
  bf16* ring_kv[2] = {};
  bf16 *ring_out = nullptr, *ring_dq16 = nullptr, *ring_dk16 = nullptr, *ring_dv16 = nullptr;
  float* ring_lse = nullptr;
  bf16* ring_bias = nullptr;  // --reset-attention-mask: one block's document bias [B, 2c, 2c] at most
  // --cp-comm-type a2a: the attention's inputs, output, output gradient and input gradients in the all-to-all's layout
  // ([B, S, heads / CP, d], every row of the sequence and this rank's share of the heads), and the all-to-all's two
  // staging buffers [CP][T, heads / CP, d].
  bf16 *a2a_q = nullptr, *a2a_k = nullptr, *a2a_v = nullptr, *a2a_o = nullptr, *a2a_do = nullptr;
  bf16 *a2a_dq = nullptr, *a2a_dk = nullptr, *a2a_dv = nullptr, *a2a_send = nullptr, *a2a_recv = nullptr;
  // ... with --reset-attention-mask: every CP rank's document starts [CP][T], and in the sequence's order [B, S].
  int32_t *doc_starts_all = nullptr, *doc_starts = nullptr;
};

}  // namespace mt
