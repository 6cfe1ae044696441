// units.h: the CPU engine's layer units, each a forward and a backward over one microbatch's rows with what
// its backward needs kept in the unit's stash (one per microbatch in flight). A transformer layer is two
// residual slots, attention and MLP (a MoE MLP will fill the second); the embedding opens the first stage
// and the output unit (final norm, output layer, loss) closes the last. Activations are this rank's Tl
// residual-stream tokens of width h; weight-gradient GEMMs go through PassContext::weight_grad.
#pragma once

#include <memory>

#include "model/cpu/pass_context.h"
#include "model/layout.h"

namespace mt::cpu {

// Token (+ learned position) embedding, vocab-parallel over TP, then hidden dropout.
struct EmbeddingUnit {
  size_t word = kNoParam, position = kNoParam;
  void forward(const PassContext& c, Buf& out) const;
  // Accumulates the tables' gradients from the gradient of the output (dx is modified: dropout).
  void backward(const PassContext& c, Buf& dx) const;
};

// out = x + dropout(proj(attention(rope(qk_norm(split(qkv(norm(x))))))) + proj_b)
struct AttentionUnit {
  struct Stash {
    Buf x, ln, ln_full, mean, rstd, q, k, v, probs, ctx;
    Buf q_in, k_in, q_mean, q_rstd, k_mean, k_rstd;  // --qk-layernorm: the heads before their norm, its statistics
  };
  const LayerParams* p = nullptr;
  void forward(const PassContext& c, Buf& x, Stash& s) const;  // x: in, then out (the input moves into the stash)
  // dout: the gradient of the output; returns into din the gradient of the input.
  void backward(const PassContext& c, const Buf& dout, Buf& din, Stash& s) const;
};

// out = x + dropout(fc2(act(fc1(norm(x)))) + fc2_b), act GELU or SwiGLU
struct MlpUnit {
  struct Stash {
    Buf x, ln, ln_full, mean, rstd, fc1, act;
  };
  const LayerParams* p = nullptr;
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
  // The gradient of (loss * scale) with respect to the unit's input.
  void backward(const PassContext& c, float scale, Buf& dx, Stash& s) const;
};

}  // namespace mt::cpu
