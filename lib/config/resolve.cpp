// resolve.cpp: Megatron's derived defaults.
#include "config/resolve.h"

#include <algorithm>

#include "config/pipeline_layout.h"

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

int64_t virtual_stages_per_rank(const Config& cfg) {
  const auto& p = cfg.parallel;
  if (p.pipeline_model_parallel_layout && p.pipeline_model_parallel_size > 0) {  // (its stages / PP, validated)
    return std::max<int64_t>(1, static_cast<int64_t>(parse_pipeline_layout(*p.pipeline_model_parallel_layout).size()) / p.pipeline_model_parallel_size);
  }
  if (p.num_virtual_stages_per_pipeline_rank) return std::max<int64_t>(1, *p.num_virtual_stages_per_pipeline_rank);
  if (p.num_layers_per_virtual_pipeline_stage && *p.num_layers_per_virtual_pipeline_stage > 0 && p.pipeline_model_parallel_size > 0) {
    return std::max<int64_t>(1, cfg.model.num_layers.value_or(0) / p.pipeline_model_parallel_size / *p.num_layers_per_virtual_pipeline_stage);
  }
  return 1;
}

std::vector<int64_t> layers_per_virtual_stage(const Config& cfg) {
  const int64_t pp = std::max<int64_t>(1, cfg.parallel.pipeline_model_parallel_size), V = virtual_stages_per_rank(cfg);
  const int64_t layers = cfg.model.num_layers.value_or(0), stages = pp * V;
  std::vector<int64_t> out(static_cast<size_t>(stages), 0);
  if (const auto& layout = cfg.parallel.pipeline_model_parallel_layout; layout) {  // (each stage's t's)
    const std::vector<PipelineLayoutStage> given = parse_pipeline_layout(*layout);
    for (size_t v = 0; v < out.size() && v < given.size(); ++v) out[v] = given[v].count('t');
    return out;
  }
  const auto& first = cfg.parallel.decoder_first_pipeline_num_layers;
  const auto& last = cfg.parallel.decoder_last_pipeline_num_layers;
  if (first || last) {  // per rank, then even over the rank's chunks
    int64_t remaining = layers, middle = pp;
    if (first) { remaining -= *first; --middle; }
    if (last && pp > 1) { remaining -= *last; --middle; }
    const int64_t each = middle > 0 ? remaining / middle : 0;
    for (int64_t r = 0; r < pp; ++r) {
      int64_t n = each;
      if (r == 0 && first) n = *first;
      if (r == pp - 1 && last && pp > 1) n = *last;
      for (int64_t c = 0; c < V; ++c) out[static_cast<size_t>(c * pp + r)] = n / V;
    }
    return out;
  }
  // Megatron's account-for-embedding / -loss: the embedding and the loss take one layer's place each.
  const int64_t embedding = cfg.parallel.account_for_embedding_in_pipeline_split ? 1 : 0;
  const int64_t loss = cfg.parallel.account_for_loss_in_pipeline_split ? 1 : 0;
  const int64_t each = (layers + embedding + loss) / stages;
  for (auto& n : out) n = each;
  out.front() -= embedding;
  out.back() -= loss;
  return out;
}

std::vector<int64_t> layers_per_pipeline_stage(const Config& cfg) {
  const int64_t pp = cfg.parallel.pipeline_model_parallel_size;
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(0, pp)), 0);
  if (pp <= 0) return out;
  const std::vector<int64_t> per = layers_per_virtual_stage(cfg);
  for (size_t vs = 0; vs < per.size(); ++vs) out[vs % static_cast<size_t>(pp)] += per[vs];
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
  // (Megatron: a negative capacity factor is None, dropless; validate() warned)
  if (cfg.moe.moe_expert_capacity_factor && *cfg.moe.moe_expert_capacity_factor < 0) cfg.moe.moe_expert_capacity_factor.reset();
  if (p.sequence_parallel && p.tensor_model_parallel_size == 1) p.sequence_parallel = false;  // validate() warned
  auto& rc = cfg.recompute;  // (--moe-layer-recompute: Megatron's mapping; validate() warned, and refused it with full)
  if (rc.moe_layer_recompute && rc.recompute_granularity.value_or("") != "full") {
    rc.recompute_granularity = "selective";
    if (std::find(rc.recompute_modules.begin(), rc.recompute_modules.end(), "moe") == rc.recompute_modules.end()) rc.recompute_modules.push_back("moe");
  }

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
  d.eval_micro_batch_size = cfg.training.eval_micro_batch_size.value_or(mbs);
  d.eval_global_batch_size = cfg.training.eval_global_batch_size.value_or(gbs);
  d.eval_num_microbatches = std::max<int64_t>(1, d.eval_global_batch_size / std::max<int64_t>(1, d.eval_micro_batch_size * d.data_parallel_size));
  // NullTokenizer is Megatron's: --vocab-size V ids and the end of document V, a vocabulary of V + 1.
  const bool null_tokenizer = cfg.data.tokenizer_type.value_or("") == "NullTokenizer" && m.vocab_size;
  const int64_t vocab = tokenizer_vocab > 0 ? tokenizer_vocab : null_tokenizer ? *m.vocab_size + 1 : m.vocab_size.value_or(0);
  d.vocab_size = vocab;
  // (--padded-vocab-size as given, --no-pad-vocab-size the vocabulary itself, as Megatron; validation checks them)
  d.padded_vocab_size = m.padded_vocab_size ? *m.padded_vocab_size
                        : vocab <= 0        ? 0
                        : m.no_pad_vocab_size ? vocab
                                              : padded_vocab_size(vocab, m.make_vocab_size_divisible_by, p.tensor_model_parallel_size);
  d.num_query_groups = effective_query_groups(cfg);
  d.layers_per_stage = layers_per_pipeline_stage(cfg);
}

}  // namespace mt
