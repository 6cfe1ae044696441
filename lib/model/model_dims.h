// model_dims.h: what both engines need to know of the decoder for one TP rank (sizes, options), the
// microbatch they train on, and the dropout keys both draw their masks from.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "kernels/gated_activation.h"
#include "kernels/rope_frequencies.h"

namespace mt {

// The dropout mask key of one sample at one site, for a training step: site 0 the embedding output (layer
// -1), 1 the attention probabilities (sample 0: one key per layer), 2 the attention block's output, 3 the
// MLP's output. Element i of the sample's [S, h] tokens is dropped when philox_uniform(key, i) < p. Both
// engines draw the same masks from it.
uint64_t dropout_key(uint64_t seed, int64_t step, int64_t sample, int64_t layer, int site);
enum DropoutSite : int { kDropEmbedding = 0, kDropAttnProbs = 1, kDropAttnOut = 2, kDropMlpOut = 3 };

struct Microbatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens, labels, positions;  // [B*S]
  // With --reset-position-ids, RoPE's positions: each token's place in its sequence (Megatron rotates by the sequence's
  // positions whatever the position ids, which only the learned position embeddings read); empty otherwise (positions).
  std::vector<int32_t> rope_positions;
  std::vector<float> loss_mask;                    // [B*S]
  std::vector<int32_t> row_start;                  // [B*S] with --reset-attention-mask, else empty
  int64_t first_sample = 0;                        // global index of the first sample (dropout keys)
  // Context parallelism (model/context_parallel.h): S is this rank's share of each sequence, seq_pos [B*S] each
  // token's place in its sequence (row_start stays in those places too) and seq_total the sequence's length;
  // empty and 0 without CP.
  std::vector<int32_t> seq_pos;
  int64_t seq_total = 0;
  // Multi-token prediction under context parallelism: module k's microbatch (model/cpu/units.h mtp_shifted of the whole
  // sequences, then this rank's slice of them: the tokens k places ahead may be another rank's), k = 1 .. N; empty
  // otherwise (the model shifts its own microbatch).
  std::vector<Microbatch> mtp;
};

// The positions RoPE rotates by: the sequence's (Microbatch::rope_positions) under --reset-position-ids, else the positions.
inline const int32_t* rope_positions(const Microbatch& mb) { return mb.rope_positions.empty() ? mb.positions.data() : mb.rope_positions.data(); }

struct ModelDims {
  int64_t L, h, nh, ng, d, F, V, S, max_pos;
  int64_t tp, tp_rank, nh_local, ng_local, F_local, V_local;
  // --num-query-groups below TP: each group's K/V (and its whole QKV block) is replicated on kv_rep TP
  // ranks, each computing its nh_local query heads of it. qh_local: query heads in the local QKV rows.
  int64_t kv_rep, qh_local;
  // swiglu: the MLP is gated (fc1 writes [gate | linear], 2F wide): SwiGLU, or with `glu` quick GeGLU, a linear offset or a
  // clamp (kernels/gated_activation.h; glu.plain_swiglu() for SwiGLU itself).
  bool rms, swiglu, bias, rope, learned_pos, tied, sequence_parallel;
  GatedActivation glu;
  bool qkv_bias = false;  // the QKV layers' biases: with every bias, or alone (--add-qkv-bias)
  bool per_token_loss = false;  // --calculate-per-token-loss: the output layer returns (and differentiates) the loss sum
  bool norm_1p = false;  // --apply-layernorm-1p: the norms scale by 1 + weight (zero-centred weights, initialised to 0)
  bool qk_norm;  // --qk-layernorm: the configured norm over each query and key head (width d), before RoPE
  bool squared_relu = false;        // --squared-relu: relu(x)^2 instead of GELU (not with SwiGLU)
  // GELU's exact erf form (Megatron's F.gelu) instead of the tanh form of its bias-GELU fusion: --no-bias-gelu-fusion, or
  // no biases (Megatron turns the fusion off with --disable-bias-linear). Not with SwiGLU or squared ReLU.
  bool gelu_erf = false;
  bool rotary_interleaved = false;  // --rotary-interleaved
  float eps, rope_base, hidden_dropout, attention_dropout, softmax_scale;
  RopeScaling rope_scaling;  // --use-rope-scaling's factor, --rotary-seq-len-interpolation-factor (kernels/rope_frequencies.h)
  std::vector<bool> rope_skipped;  // --no-rope-freq: per global layer, true where the layer has no RoPE (empty: none)
  // Whether global layer `layer` rotates its queries and keys.
  bool rope_in(int64_t layer) const {
    return rope && (rope_skipped.empty() || !rope_skipped[static_cast<size_t>(spec_layer(layer))]);
  }
  // Multi-token prediction (--mtp-num-layers): its modules' transformer layers are global layers L .. L + mtp - 1 (their
  // names, dropout keys and statistics), each of the last decoder layer's kind (Megatron's MTP spec): spec_layer maps them
  // to it for the per-layer patterns. mtp_loss_scale: --mtp-loss-scaling-factor / --mtp-num-layers.
  int64_t mtp = 0;
  float mtp_loss_scale = 0;
  int64_t spec_layer(int64_t layer) const { return layer < L ? layer : L - 1; }
  // Sliding-window attention (--window-size, --window-attn-skip-freq): per global layer the left bound L of the window
  // (keys i - L .. i), -1 for full causal attention; empty: no layer has one.
  std::vector<int64_t> windows;
  int64_t window_in(int64_t layer) const { return windows.empty() ? -1 : windows[static_cast<size_t>(spec_layer(layer))]; }
  // Attention sinks (--softmax-type): none, a fixed logit 0 (off-by-one) or a learned logit per head (learnable: the
  // layer's attention.softmax_offset [nh], split over TP with the heads).
  enum class Sink { kNone, kOffByOne, kLearnable } sink = Sink::kNone;
  int64_t rot_dim;
  // Multi-latent attention (--multi-latent-attention; model/cpu/mla_attention.cpp): the queries' latent rank (0: one
  // query projection), the keys' and values' latent rank, each head's widths without RoPE (qk_nope), with it (qk_rope;
  // the key's part one per token, shared by the heads) and of the values (v_dim). d stays the query / key head's width
  // qk_nope + qk_rope, ng = nh; softmax_scale is MLA's (YaRN's mscale squared over sqrt(d)); rope_scaling YaRN's unless
  // --rope-type rope.
  bool mla = false;
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_dim = 0;
  // Mixture of experts (experts == 0: a dense model). The experts are split over EP (experts_local each,
  // global indices [ep_rank * experts_local, ...)) and each expert's MLP over expert-TP (F_moe_local); the
  // shared expert is a dense MLP over TP.
  int64_t experts = 0, topk = 0, F_moe = 0, F_moe_local = 0, experts_local = 0;
  int64_t ep = 1, ep_rank = 0, etp = 1, etp_rank = 0;
  int64_t F_shared = 0, F_shared_local = 0;
  // Context parallelism: CP ranks (each a share of every sequence) and --cp-comm-type a2a (else p2p).
  int64_t cp = 1;
  bool cp_a2a = false;
  // FP8 (--fp8-format): the linear layers' GEMMs (QKV, projection, fc1, fc2) of the layers fp8_layer() names,
  // Transformer Engine's tensorwise or delayed scaling (fp8_delayed: model/fp8_scaling.h, with the amax history's
  // length, --fp8-amax-compute-algo max and the margin): inputs and weights in E4M3, output gradients in E5M2
  // (hybrid) or E4M3; the weight-gradient GEMM in FP8 too (--no-fp8-wgrad counts for the delayed recipe only, as in
  // Megatron). --first-last-layers-bf16 keeps the first fp8_bf16_start and the last fp8_bf16_end layers in 16 bits.
  bool fp8 = false, fp8_grad_e5m2 = false, fp8_wgrad = true;
  bool fp8_delayed = false, fp8_max_algo = false, fp8_amax_over_dp = true;  // (--tp-only-amax-red: not over DP)
  bool fp8_blockwise = false;  // --fp8-recipe blockwise: 1 x 128 blocks of inputs and gradients, 128 x 128 of weights
  int64_t fp8_history_len = 1, fp8_margin = 0;
  int64_t fp8_bf16_start = 0, fp8_bf16_end = 0;
  bool fp8_layer(int64_t global_layer) const { return fp8 && global_layer >= fp8_bf16_start && global_layer < L - fp8_bf16_end; }
};

// ep_rank / ep and etp_rank / etp: this rank's place in the expert grid (EP and expert-TP).
// YaRN's RoPE (--position-embedding-type yarn) from its flags, Megatron's defaults where unset (kernels/rope_frequencies.h).
RopeScaling yarn_scaling(const ModelConfig& m);

ModelDims model_dims(const Config& cfg, int64_t tp_rank, int64_t tp_size, int64_t ep_rank = 0, int64_t ep = 1, int64_t etp_rank = 0,
                     int64_t etp = 1);

}  // namespace mt
