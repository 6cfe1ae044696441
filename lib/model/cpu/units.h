// units.h: the CPU engine's layer units, each a forward and a backward over one microbatch's rows with what
// its backward needs kept in the unit's stash (one per microbatch in flight). A transformer layer is two
// residual slots, attention and MLP (a MoE MLP will fill the second); the embedding opens the first stage
// and the output unit (final norm, output layer, loss) closes the last. Activations are this rank's Tl
// residual-stream tokens of width h; weight-gradient GEMMs go through PassContext::weight_grad.
#pragma once

#include <memory>

#include <map>
#include <optional>
#include <string>

#include "config/config.h"
#include "kernels/cpu/router.h"
#include "model/cpu/context_attention.h"
#include "model/cpu/linear_gemms.h"
#include "model/cpu/moe_dispatch.h"
#include "model/cpu/pass_context.h"
#include "model/layout.h"

namespace mt::cpu {

// Token (+ learned position) embedding, vocab-parallel over TP, then hidden dropout (its masks keyed by dropout_layer: -1
// for the model's embedding, a multi-token prediction module's layer for its own).
struct EmbeddingUnit {
  size_t word = kNoParam, position = kNoParam;
  int64_t dropout_layer = -1;
  // Under SP the positions' gradient (a replicated parameter) is summed over TP at the iteration's last backward: by the
  // model's embedding only (multi-token prediction's modules add to it before, through the same table).
  bool sums_positions = true;
  void forward(const PassContext& c, Buf& out) const;
  // Accumulates the tables' gradients from the gradient of the output (dx is modified: dropout).
  void backward(const PassContext& c, Buf& dx) const;
};

// out = x + dropout(proj(attention(rope(qk_norm(split(qkv(norm(x))))))) + proj_b)
struct AttentionUnit {
  struct Stash {
    Buf x, ln, ln_full, mean, rstd, q, k, v, probs, ctx;
    Buf sink_probs;  // --softmax-type: each row's sink probability [B, nh, S]
    Buf q_in, k_in, q_mean, q_rstd, k_mean, k_rstd;  // --qk-layernorm: the heads before their norm, its statistics
    ContextAttentionStash cp;                        // context parallelism (then no probs)
    LinearStash qkv_lin, proj_lin;                   // FP8: the GEMMs' quantised operands
    // Multi-latent attention (mla_attention.cpp): the latents before and after their norms and the norms' statistics,
    // the values' part of the context (the output projection's input); q, k, v hold the heads padded to one width.
    Buf q_latent_in, q_latent, q_latent_mean, q_latent_rstd, kv_latent_in, kv_latent, kv_latent_mean, kv_latent_rstd, ctx_v;
    LinearStash q_lin, q_up_lin, kv_down_lin, kv_up_lin;
  };
  const LayerParams* p = nullptr;
  void forward(const PassContext& c, Buf& x, Stash& s) const;  // x: in, then out (the input moves into the stash)
  // dout: the gradient of the output; returns into din the gradient of the input.
  void backward(const PassContext& c, const Buf& dout, Buf& din, Stash& s) const;
};

// The core attention of one layer, c.D's head width d: s.q [T, nh_local, d], s.k and s.v [T, ng_local, d] in, s.ctx
// [T, nh_local, d] out (the context-parallel blocks, or the local softmax with its probabilities kept; --softmax-type's
// sinks); the backward's dq, dk, dv are overwritten.
void core_attention_forward(const PassContext& c, const LayerParams& ly, AttentionUnit::Stash& s);
void core_attention_backward(const PassContext& c, const LayerParams& ly, const Buf& dctx, Buf& dq, Buf& dk, Buf& dv, AttentionUnit::Stash& s);
// The attention slot's ends, whatever its attention: the input norm of this rank's tokens gathered to the TP group's
// (s.x, s.ln, s.ln_full; x moves into the stash); from the output projection's input ctx [T, width], the row-parallel
// projection reduced to this rank's tokens, its bias, dropout and the residual into x. Their backwards: dctx from the
// output's gradient (the projection's weight gradient queued), and from the TP group's (partial) gradient of the norm's
// output the gradient of the slot's input, the residual's included.
void attention_slot_input(const PassContext& c, const LayerParams& ly, Buf& x, AttentionUnit::Stash& s);
void attention_slot_output(const PassContext& c, const LayerParams& ly, const Buf& ctx, int64_t width, Buf& x, AttentionUnit::Stash& s);
void attention_slot_output_backward(const PassContext& c, const LayerParams& ly, const Buf& dout, const Buf& ctx, int64_t width, Buf& dctx,
                                    AttentionUnit::Stash& s);
void attention_slot_input_backward(const PassContext& c, const LayerParams& ly, Buf& dln_full, const Buf& dout, Buf& dx, AttentionUnit::Stash& s);
// Multi-latent attention's slot (DeepSeek's, mla_attention.cpp): AttentionUnit's forward and backward when c.D.mla.
void mla_attention_forward(const PassContext& c, const LayerParams& ly, Buf& x, AttentionUnit::Stash& s);
void mla_attention_backward(const PassContext& c, const LayerParams& ly, const Buf& dout, Buf& dx, AttentionUnit::Stash& s);

// The TP-parallel MLP body over the TP group's tokens: fc2(act(fc1(gather(ln)))) reduced back to this rank's
// tokens (SP: reduce-scattered), without fc2's bias; act GELU or SwiGLU. The dense MLP and the shared expert.
// The MLP's activation over n rows of fc1's output (F columns out; SwiGLU's fc1 rows hold 2F): SwiGLU, squared ReLU or
// GELU as the model has it, and its backward (dfc1 from dact, overwritten). Shared by the dense MLP and the experts.
void mlp_activation_forward(const ModelDims& D, float* act, const float* fc1, int64_t n, int64_t F);
void mlp_activation_backward(const ModelDims& D, float* dfc1, const float* dact, const float* fc1, int64_t n, int64_t F);

struct MlpBody {
  struct Stash {
    Buf ln_full, fc1, act;
    LinearStash fc1_lin, fc2_lin;  // FP8: the GEMMs' quantised operands
  };
  size_t fc1_w = kNoParam, fc1_b = kNoParam, fc2_w = kNoParam;
  int64_t F_local = 0;
  int64_t layer = -1;  // the global layer (its GEMMs' precision: FP8 where fp8_layer() says); -1: never FP8
  // out[Tl, h] (overwritten) from ln[Tl, h].
  void forward(const PassContext& c, const float* ln, Buf& out, Stash& s) const;
  // dln[Tl, h] (overwritten) from the output gradient dy[Tl, h].
  void backward(const PassContext& c, const float* dy, Buf& dln, Stash& s) const;
};

// out = x + dropout(fc2(act(fc1(norm(x)))) + fc2_b), act GELU or SwiGLU
struct MlpUnit {
  struct Stash {
    Buf x, ln, mean, rstd;
    MlpBody::Stash body;
  };
  const LayerParams* p = nullptr;
  void forward(const PassContext& c, Buf& x, Stash& s) const;
  void backward(const PassContext& c, const Buf& dout, Buf& din, Stash& s) const;
};

// The MoE settings of the configuration (Megatron's flags).
struct MoeOptions {
  RouterSettings router;
  bool router_fp64 = false;
  std::optional<double> capacity_factor;
  bool drop_by_probability = true, pad_to_capacity = false;
  double aux_coeff[3] = {0, 0, 0};  // aux_loss, seq_aux_loss, global_aux_loss (config.h's kAuxLossTypes); 0: not chosen
  double z_coeff = 0;
  bool alltoall = false;
  bool probs_on_input = false;  // --moe-apply-probs-on-input: the weight scales the expert's input (top-1), the combine adds
  bool force_balance = false;   // --moe-router-force-load-balancing: random logits (model/moe_random_logits.h)
  // --moe-router-load-balancing-type sinkhorn: in training the choice is the top-k of the Sinkhorn-normalised logits over
  // the microbatch's tokens; the weights (and the choice in evaluation) sigmoid's at top-1, else the softmax's over all
  // experts (router settings to match).
  bool sinkhorn = false;
  // --moe-router-load-balancing-type quantile_balancing: the choice is the top-k of logits - qb_beta (the layer's
  // quantile_bias); in training each microbatch's column quantile is accumulated for the iteration's update.
  bool quantile = false;
  float jitter_eps = 0;  // --moe-input-jitter-eps (0: none; model/moe_input_jitter.h)
  static MoeOptions from(const Config& cfg);
  bool aux_enabled() const { return !sinkhorn && (aux_coeff[0] > 0 || aux_coeff[1] > 0 || aux_coeff[2] > 0); }
};

// out = x + dropout(routed experts(norm(x)) + shared expert(norm(x))): Megatron's MoE layer in the MLP slot.
// The router scores this rank's tokens, the dispatcher sends each kept choice to its expert's rank and brings the
// output back weighted; the load-balancing and z losses add their gradients to the router's (scaled as the lm
// loss) and their values to the iteration's statistics.
struct MoeUnit {
  struct Stash {
    Buf x, ln, mean, rstd, logits, weight, aux_dscores;  // logits, aux_dscores [Tl, E]; weight [Tl, k]
    Buf scaled_ln;  // --moe-apply-probs-on-input: each kept token's norm output times its routing weight [Tl, h]
    std::vector<int32_t> top;                            // [Tl, k]
    std::vector<uint8_t> keep;                           // [Tl, k]
    TokenDispatcher dispatcher{true};
    Buf rows, fc1, act;  // the local experts' rows (expert-major), fc1 outputs and activations
    std::vector<int64_t> per_expert;
    std::vector<LinearStash> fc1_lin, fc2_lin;  // FP8: each local expert's GEMMs' quantised operands
    MlpBody::Stash shared;
    Buf shared_out, shared_gate;
    Buf jittered;  // --moe-input-jitter-eps: the router's input [Tl, h] (the norm output times the noise)  // --moe-shared-expert-gate: the shared expert's ungated output [Tl, h] and its gates [Tl]
    float z_scale = 0;  // d(z loss) / d(sum of lse^2 over this rank's tokens)
  };
  const LayerParams* p = nullptr;
  const MoeOptions* opt = nullptr;
  void forward(const PassContext& c, Buf& x, Stash& s) const;
  void backward(const PassContext& c, const Buf& dout, Buf& din, Stash& s) const;
};

// Final norm, the vocab-parallel output layer and the cross entropy (mean over the unmasked tokens).
struct OutputUnit {
  struct Stash {
    Buf x, ln, ln_full, mean, rstd, logits, lse, losses;
    float denom = 1;
  };
  size_t norm_w = kNoParam, norm_b = kNoParam, weight = kNoParam;
  float forward(const PassContext& c, Buf& x, Stash& s) const;
  // The gradient of (loss * scale) with respect to the unit's input; with dln, plus the gradient that reaches the norm's
  // output (s.ln, this rank's tokens) from elsewhere (multi-token prediction's next module).
  void backward(const PassContext& c, float scale, Buf& dx, Stash& s, const Buf* dln = nullptr) const;
};

// Multi-token prediction's input to module k's transformer layer (mtp_unit.cpp, Megatron's MultiTokenPredictionLayer):
// x = W [enorm(e) | hnorm(h)], e the embedding of the tokens k places ahead, h module k - 1's normed output (the model's
// for k = 1), W [h, 2h] whole on every TP rank; this rank's tokens.
struct MtpUnit {
  struct Stash {
    Buf e, h, cat, e_mean, e_rstd, h_mean, h_rstd;
  };
  const MtpParams* p = nullptr;
  void forward(const PassContext& c, Buf e, const Buf& h, Buf& x, Stash& s) const;
  // From x's gradient: the embedding's (de) and h's (dh); the projection's and the norms' weight gradients accumulated.
  void backward(const PassContext& c, const Buf& dx, Buf& de, Buf& dh, Stash& s) const;
};
// The microbatch as multi-token prediction module k sees it: every sample's tokens, positions, labels and loss mask moved
// k places left (Megatron's roll_tensor, k times), the places rolled in holding 0 (masked out).
Microbatch mtp_shifted(const Microbatch& mb, int64_t k);

}  // namespace mt::cpu
