// attention.h: causal self-attention with grouped-query heads (the reference "core attention"),
// forward and backward, plus the split / merge of Megatron's fused QKV projection output.
#pragma once
#include <cstdint>

namespace mt::cpu {

// qkv rows hold, for each of ng query groups, (nh/ng) query heads then one key and one value head,
// each d wide (Megatron's layout, so a TP shard is a run of whole groups).
void qkv_split(float* q, float* k, float* v, const float* qkv, int64_t T, int64_t nh, int64_t ng, int64_t d);
void qkv_merge(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t T, int64_t nh, int64_t ng, int64_t d);

struct AttentionShape {
  int64_t B, S, nh, ng, d;
  float scale;          // softmax scale, 1/sqrt(d) by default
  float dropout;        // attention dropout probability
  uint64_t dropout_key; // RNG key of this layer and step
  int64_t sample0;      // global index of sample 0 and of local head 0: the dropout mask of an
  int64_t head0;        // element is the same under any DP or TP split
  // Optional [B*S]: query i attends to keys [row_start[i], i] only (--reset-attention-mask: no
  // attention across documents). Null: plain causal.
  const int32_t* row_start = nullptr;
  // Sliding-window attention (--window-size): query i attends to keys i - window .. i only; -1: no window.
  int64_t window = -1;
  // Attention sinks (--softmax-type off-by-one / learnable, Megatron's SoftmaxOne): [nh] logits, one per local head, that
  // join every row's softmax as a key with no value (the row's probabilities then sum to below 1); null: none. The
  // forward writes each row's sink probability into sink_probs [B, nh, S] where given; the backward adds each head's
  // gradient into sink_grad [nh] where given, from those probabilities (which it then needs).
  const float* sink = nullptr;
  float* sink_grad = nullptr;
  float* sink_probs = nullptr;
};

// Whether attention dropout (probability p) keeps the probability of query i and key j (places in a sequence of
// length S) of global head `head` in global sample `sample`: the mask every split of the model draws alike.
bool attention_dropout_keeps(uint64_t key, int64_t sample, int64_t head, int64_t i, int64_t j, int64_t S, float p);

// q: [B,S,nh,d], k/v: [B,S,ng,d], out: [B,S,nh,d], probs: [B,nh,S,S] saved for backward.
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, const AttentionShape& s);
// dq overwritten, dk/dv overwritten. scratch: [S*S] floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, const AttentionShape& s, float* scratch);

}  // namespace mt::cpu
