// attention_blocks.h: causal attention between a block of queries and a block of keys whose places in the
// sequence are given explicitly (context parallelism: each rank's queries against every rank's keys, in the
// load-balanced chunk order), as flash attention computes it in pieces: each block's output with its
// log-sum-exp, merged across blocks; the backward of a block from the merged output and log-sum-exp.
// Grouped-query heads; --reset-attention-mask's documents (a query sees keys of its own document only).
#pragma once

#include <cstdint>

namespace mt::cpu {

struct BlockAttention {
  int64_t B = 0, Sq = 0, Sk = 0, nh = 0, ng = 0, d = 0;
  float scale = 1;
  const int32_t* q_pos = nullptr;    // [B * Sq] each query's position in its sequence
  const int32_t* k_pos = nullptr;    // [B * Sk]
  const int32_t* q_start = nullptr;  // [B * Sq] or null: the position where each query's document starts
  // Attention dropout (kernels/cpu/attention.h's mask, by places in the sequence): on the probabilities, not on the
  // normaliser, so blocks still merge by their log-sum-exp.
  float dropout = 0;
  uint64_t dropout_key = 0;
  int64_t sample0 = 0, head0 = 0, seq_total = 0;  // global sample of b = 0, global head of head 0, sequence length
  // Sliding-window attention (--window-size): a query at place p sees keys at p - window .. p; -1: no window.
  int64_t window = -1;
  float dropped(int64_t b, int64_t hd, int64_t i, int64_t j) const;  // the factor of probability (i, j): 0 or 1 / (1 - p)
  bool allowed(int64_t b, int64_t i, int64_t j) const {
    const int32_t kp = k_pos[b * Sk + j], qp = q_pos[b * Sq + i];
    return kp <= qp && (!q_start || kp >= q_start[b * Sq + i]) && (window < 0 || kp >= qp - window);
  }
};

// q [B, Sq, nh, d], k / v [B, Sk, ng, d]. out [B, Sq, nh, d] and lse [B, nh, Sq] of this block alone (a query with
// no allowed key: out 0, lse -inf).
void block_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const BlockAttention& s);
// Merges a block's (out, lse) into the running (acc, acc_lse): o = sum_b exp(lse_b - lse) o_b, lse = log sum_b exp(lse_b).
void merge_attention_block(float* acc, float* acc_lse, const float* out, const float* lse, int64_t B, int64_t Sq, int64_t nh, int64_t d);
// Attention sinks (--softmax-type): merged as one more block with no value whose log-sum-exp is the head's sink logit
// (sink [nh]); after it the backward's blocks need no change. And the sink logits' gradient from the merged output and
// lse: sink_grad[h] -= sum over rows of exp(sink[h] - lse) rowsum(dout * out).
void merge_attention_sink(float* acc, float* acc_lse, const float* sink, int64_t B, int64_t Sq, int64_t nh, int64_t d);
void attention_sink_grad(float* sink_grad, const float* dout, const float* out, const float* lse, const float* sink, int64_t B, int64_t Sq, int64_t nh,
                         int64_t d);
// The block's share of the backward, given the merged output `out`, its lse and dout: dq += , dk += , dv += .
void block_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const BlockAttention& s);

}  // namespace mt::cpu
