// resolve.h: derived values (Megatron's defaults that depend on other flags and on the world size).
// Run after validate(): fills unset model-only flags (ffn, kv-channels, expert TP, MoE ffn) in place
// and world-dependent values in Config::derived.
#pragma once

#include <vector>

#include "config/config.h"

namespace mt {

int64_t default_ffn_hidden_size(int64_t hidden, bool swiglu);
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp);
// Layers on each pipeline stage (uneven first/last stages honoured).
std::vector<int64_t> layers_per_pipeline_stage(const Config& cfg);
// Effective query groups: num_query_groups with GQA, else one group per head.
int64_t effective_query_groups(const Config& cfg);

// vocab: the tokenizer's vocabulary size when known (0: use --vocab-size).
void resolve(Config& cfg, int64_t world_size, int64_t tokenizer_vocab = 0);

}  // namespace mt
