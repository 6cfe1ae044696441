// resolve.cpp: Megatron's derived defaults.
#include "config/resolve.h"

#include <algorithm>

namespace mt {

int64_t default_ffn_hidden_size(int64_t hidden, bool swiglu) {
  if (swiglu) return static_cast<int64_t>(4.0 * hidden * 2.0 / 3.0 / 64.0) * 64;
  return 4 * hidden;
}

int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp) {
  const int64_t multiple = divisible_by * tp;
  if (multiple <= 0) return vocab;
  return (vocab + multiple - 1) / multiple * multiple;
}

int64_t effective_query_groups(const Config& cfg) {
  if (cfg.model.group_query_attention) return cfg.model.num_query_groups;
  return cfg.model.num_attention_heads.value_or(1);
}

std::vector<int64_t> layers_per_pipeline_stage(const Config& cfg) {
  const int64_t pp = cfg.parallel.pipeline_model_parallel_size;
  const int64_t layers = cfg.model.num_layers.value_or(0);
  std::vector<int64_t> out(static_cast<size_t>(pp), 0);
  if (pp <= 0) return out;
  const auto& first = cfg.parallel.decoder_first_pipeline_num_layers;
  const auto& last = cfg.parallel.decoder_last_pipeline_num_layers;
  int64_t remaining = layers;
  int64_t middle = pp;
  if (first) { remaining -= *first; --middle; }
  if (last && pp > 1) { remaining -= *last; --middle; }
  const int64_t each = middle > 0 ? remaining / middle : 0;
  for (int64_t s = 0; s < pp; ++s) out[static_cast<size_t>(s)] = each;
  if (first) out.front() = *first;
  if (last && pp > 1) out.back() = *last;
  return out;
}

void resolve(Config& cfg, int64_t world_size, int64_t tokenizer_vocab) {
  auto& m = cfg.model;
  auto& p = cfg.parallel;
  auto& d = cfg.derived;
  if (m.hidden_size && !m.ffn_hidden_size) m.ffn_hidden_size = default_ffn_hidden_size(*m.hidden_size, m.swiglu);
  if (m.hidden_size && m.num_attention_heads && !m.kv_channels && *m.num_attention_heads > 0) {
    m.kv_channels = *m.hidden_size / *m.num_attention_heads;
  }
  if (!m.max_position_embeddings && cfg.data.seq_length && m.position_embedding_type != "learned_absolute") {
    m.max_position_embeddings = cfg.data.seq_length;
  }
  if (!p.expert_tensor_parallel_size) p.expert_tensor_parallel_size = p.tensor_model_parallel_size;
  if (cfg.moe.num_experts && !cfg.moe.moe_ffn_hidden_size) cfg.moe.moe_ffn_hidden_size = m.ffn_hidden_size;
  if (p.sequence_parallel && p.tensor_model_parallel_size == 1) p.sequence_parallel = false;  // validate() warned

  d.world_size = world_size;
  const int64_t model_par = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size;
  d.data_parallel_size = model_par > 0 ? std::max<int64_t>(1, world_size / model_par) : 1;
  d.expert_tensor_parallel_size = *p.expert_tensor_parallel_size;
  const int64_t expert_par = d.expert_tensor_parallel_size * p.expert_model_parallel_size * p.pipeline_model_parallel_size;
  d.expert_data_parallel_size = expert_par > 0 ? std::max<int64_t>(1, world_size / expert_par) : 1;
  const int64_t mbs = cfg.training.micro_batch_size.value_or(1);
  const int64_t gbs = cfg.training.global_batch_size.value_or(mbs * d.data_parallel_size);
  d.global_batch_size = gbs;
  d.num_microbatches = std::max<int64_t>(1, gbs / std::max<int64_t>(1, mbs * d.data_parallel_size));
  const int64_t vocab = tokenizer_vocab > 0 ? tokenizer_vocab : m.vocab_size.value_or(0);
  d.vocab_size = vocab;
  d.padded_vocab_size = vocab > 0 ? padded_vocab_size(vocab, m.make_vocab_size_divisible_by, p.tensor_model_parallel_size) : 0;
  d.num_query_groups = effective_query_groups(cfg);
  d.layers_per_stage = layers_per_pipeline_stage(cfg);
}

}  // namespace mt
