// resolve.h: derived values (Megatron's defaults that depend on other flags and on the world size).
// Run after validate(): fills unset model-only flags (ffn, kv-channels, expert TP, MoE ffn) in place
// and world-dependent values in Config::derived.
#pragma once

#include <vector>

#include "config/config.h"

namespace mt {

int64_t default_ffn_hidden_size(int64_t hidden, bool swiglu);
int64_t padded_vocab_size(int64_t vocab, int64_t divisible_by, int64_t tp);
// Model chunks per pipeline rank: --num-virtual-stages-per-pipeline-rank, or the layers per stage over
// --num-layers-per-virtual-pipeline-stage; 1 without interleaving.
int64_t virtual_stages_per_rank(const Config& cfg);
// Transformer layers on each virtual stage, in Megatron's order (virtual stage c x PP + r is chunk c of
// pipeline rank r): an even split, or uneven first / last stages (each rank's layers even over its chunks),
// or with --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split the embedding
// and the loss counted as one layer each on the first and the last virtual stage.
std::vector<int64_t> layers_per_virtual_stage(const Config& cfg);
// Layers on each pipeline stage (all its chunks).
std::vector<int64_t> layers_per_pipeline_stage(const Config& cfg);
// Effective query groups: num_query_groups with GQA, else one group per head.
int64_t effective_query_groups(const Config& cfg);

// vocab: the tokenizer's vocabulary size when known (0: use --vocab-size).
void resolve(Config& cfg, int64_t world_size, int64_t tokenizer_vocab = 0);

}  // namespace mt
