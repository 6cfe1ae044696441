// tiny_models.h: the tiny GPT (LayerNorm, GELU, biases, learned positions, tied embeddings) and LLaMA
// (RMSNorm, SwiGLU, RoPE, 2 query groups, untied, no biases) decoders the model tests share: vocabulary 11,
// hidden 16, 4 heads, sequence 6, micro batch 2, and the microbatch they train on in the tests.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "config/resolve.h"
#include "model/model_dims.h"

namespace mt::test {

inline Config tiny_decoder(bool llama, int64_t layers = 2, double dropout = 0.0, bool qk_norm = false) {
  Config c;
  c.model.num_layers = layers;
  c.model.hidden_size = 16;
  c.model.num_attention_heads = 4;
  c.model.vocab_size = 11;
  c.model.make_vocab_size_divisible_by = 1;
  c.model.hidden_dropout = dropout;
  c.model.attention_dropout = dropout;
  c.model.init_method_std = 0.3;
  c.model.max_position_embeddings = 8;
  c.data.seq_length = 6;
  c.training.micro_batch_size = 2;
  if (llama) {
    c.model.normalization = "RMSNorm";
    c.model.swiglu = true;
    c.model.ffn_hidden_size = 24;
    c.model.position_embedding_type = "rope";
    c.model.group_query_attention = true;
    c.model.num_query_groups = 2;
    c.model.untie_embeddings_and_output_weights = true;
    c.model.disable_bias_linear = true;
  } else {
    c.model.ffn_hidden_size = 20;
  }
  c.model.qk_layernorm = qk_norm;
  resolve(c, 1);
  return c;
}

// Two sequences of 6 tokens of the tiny vocabulary, one position's loss masked out.
inline Microbatch tiny_batch() {
  Microbatch mb;
  mb.B = 2;
  mb.S = 6;
  mb.tokens = {1, 5, 3, 9, 0, 2, 4, 4, 7, 10, 6, 8};
  mb.labels = {5, 3, 9, 0, 2, 7, 4, 7, 10, 6, 8, 1};
  mb.positions = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  mb.loss_mask = {1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1};
  return mb;
}

}  // namespace mt::test
