// upcycle.cpp: the upcycled MoE model's parameters mapped onto the dense checkpoint's tensors.
#include "checkpoint/upcycle.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/errors.h"

namespace mt {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

Config upcycling_dense_config(const Config& run) {
  Config dense = run;
  const int64_t expert_width = run.moe.moe_ffn_hidden_size.value_or(run.model.ffn_hidden_size.value_or(0));
  dense.model.ffn_hidden_size = expert_width * run.moe.moe_upcycling_granularity;
  dense.moe = MoeConfig{};
  return dense;
}

double upcycling_weight_scale(const Config& run) {
  const MoeConfig& m = run.moe;
  const double g = static_cast<double>(m.moe_upcycling_granularity), experts = static_cast<double>(m.num_experts.value_or(1));
  // Megatron's activation scale: (expansion rate x g x g) / topk with the softmax over all experts, g otherwise.
  const double activation = m.moe_router_pre_softmax ? experts * g / static_cast<double>(m.moe_router_topk) : g;
  return gated_mlp(run.model) || run.model.squared_relu ? std::cbrt(activation) : std::sqrt(activation);
}

std::optional<UpcycleSource> upcycling_source(const Config& run, const ParamInfo& p) {
  UpcycleSource src{p, 1.0f};
  const size_t experts_at = p.name.find(".mlp.experts.");
  if (experts_at == std::string::npos) {
    if (p.name.find(".mlp.router.") != std::string::npos || p.name.find(".mlp.shared_experts.") != std::string::npos) return std::nullopt;
    return src;  // a tensor both models have
  }
  // layers.L.mlp.experts.E.<rest>  <-  layers.L.mlp.<rest>
  const size_t index_at = experts_at + std::strlen(".mlp.experts."), dot = p.name.find('.', index_at);
  const int64_t expert = std::stoll(p.name.substr(index_at, dot - index_at));
  const std::string rest = p.name.substr(dot + 1);
  src.view.name = p.name.substr(0, experts_at) + ".mlp." + rest;
  const int64_t g = run.moe.moe_upcycling_granularity;
  // The dimension along the MLP's hidden width: fc1's rows (weights and biases), fc2's columns; fc2's bias has none.
  const int width_dim = starts_with(rest, "fc1") ? 0 : rest == "fc2.weight" ? 1 : -1;
  if (width_dim < 0) return src;  // (fc2's bias: a copy, unscaled, as Megatron's)
  src.scale = static_cast<float>(upcycling_weight_scale(run));
  src.view.global_shape[static_cast<size_t>(width_dim)] *= g;
  const int64_t slice = expert % g;
  if (p.shard_dim >= 0 && p.shard_count > 1) {  // expert-TP cuts the same dimension: shard r of slice j is shard j x count + r of the dense width
    if (p.shard_dim != width_dim) throw std::logic_error("upcycling: " + p.name + " is sharded along another dimension than its width");
    src.view.shard_rank = slice * p.shard_count + p.shard_rank;
    src.view.shard_count = g * p.shard_count;
  } else if (g > 1) {
    src.view.shard_dim = width_dim;
    src.view.shard_rank = slice;
    src.view.shard_count = g;
  }
  return src;
}

void repeat_router_rows(const Config& run, const ParamInfo& p, float* values) {
  const int64_t g = run.moe.moe_upcycling_granularity;
  if (g == 1 || p.name.find(".mlp.router.") == std::string::npos || p.name.find("expert_bias") != std::string::npos ||
      p.name.find("qb_beta") != std::string::npos) {
    return;
  }
  if (p.shard_dim >= 0 && p.shard_count > 1) throw std::logic_error("upcycling: the router " + p.name + " is sharded");
  const int64_t rows = p.global_shape[0], cols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
  const std::vector<float> initial(values, values + rows * cols);
  for (int64_t e = 0; e < rows; ++e) std::memcpy(values + e * cols, initial.data() + (e / g) * cols, static_cast<size_t>(cols) * sizeof(float));
}

void check_upcycling_destination(const Config& run) {
  const std::string& save = run.checkpoint.save.value_or("");
  if (!save.empty() && latest_checkpoint(save)) {
    throw DataError("--save " + save + " already holds a checkpoint (iteration " + std::to_string(*latest_checkpoint(save)) +
                    "): --moe-use-upcycling is for the first run only; to continue the upcycled model drop it and --load " + save);
  }
}

}  // namespace mt
