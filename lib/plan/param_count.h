// param_count.h: parameters of the model a config describes: in total, per layer, and held by one
// rank under a TP/PP/EP layout. The engine's parameter list must agree with it (tested).
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

struct ParamCounts {
  int64_t embedding = 0;         // word embeddings (padded vocab x h)
  int64_t position = 0;          // learned absolute positions
  int64_t output = 0;            // untied output layer
  int64_t dense_layer = 0;       // one dense transformer layer
  int64_t moe_layer = 0;         // one MoE transformer layer (all experts)
  int64_t final_norm = 0;
  int64_t num_dense_layers = 0;
  int64_t num_moe_layers = 0;
  int64_t total = 0;
  int64_t active = 0;            // per token (top-k experts)
  int64_t mtp_layers = 0;        // multi-token prediction's modules (--mtp-num-layers), each a layer of the last layer's kind
  int64_t mtp_module = 0;        // ... and its norms and projection
};

// Requires a resolved config (padded vocab known).
ParamCounts count_params(const Config& cfg);

struct RankParams {
  int64_t dense = 0;   // parameters whose gradients reduce over DP x CP
  int64_t expert = 0;  // expert parameters (reduce over expert-DP)
  int64_t total() const { return dense + expert; }
};

// Parameters held by the most loaded rank of pipeline stage `stage` (TP/EP sharded).
RankParams params_on_rank(const Config& cfg, int64_t stage);

}  // namespace mt
