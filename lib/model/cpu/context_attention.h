// context_attention.h: core attention under context parallelism on the CPU engine (Transformer Engine's
// attention with CP, as Megatron runs it). p2p (ring attention): the K/V blocks of the CP ranks pass around the
// ring by send / receive while the current block is computed; the blocks' outputs merge by their log-sum-exp;
// the backward passes each block's dK / dV along with it until they are home. a2a (Ulysses): an all-to-all swaps
// the sequence split for a head split, attention runs over the whole sequence for this rank's heads, and a
// second all-to-all swaps back. Both mask causally and by document on the tokens' places in the sequence.
#pragma once

#include <vector>

#include "model/cpu/pass_context.h"

namespace mt::cpu {

struct ContextAttentionStash {
  Buf out, lse;                        // p2p: this rank's queries' merged output and lse; a2a: the head split's
  Buf q, k, v;                         // a2a: the head split's queries, keys and values over the whole sequence
  std::vector<int32_t> pos, start;     // a2a: the whole sequence's token places and document starts
};

// q [B, S, nh, d], k / v [B, S, ng, d] of this rank's tokens (nh, ng: this TP rank's heads); ctx [B, S, nh, d].
// layer: the global layer (attention dropout's key). sink: --softmax-type's logits of this TP rank's nh heads (null:
// none), merged with the blocks as one with no value.
void context_attention_forward(const PassContext& c, int64_t layer, const Buf& q, const Buf& k, const Buf& v, Buf& ctx, ContextAttentionStash& s,
                               const float* sink = nullptr);
// dq, dk, dv (overwritten) from dctx; with sinks their gradient added into sink_grad [nh] (this rank's queries' share,
// summed over CP with the other gradients).
void context_attention_backward(const PassContext& c, int64_t layer, const Buf& dctx, const Buf& q, const Buf& k, const Buf& v, Buf& dq, Buf& dk, Buf& dv,
                                ContextAttentionStash& s, const float* sink = nullptr, float* sink_grad = nullptr);

}  // namespace mt::cpu
