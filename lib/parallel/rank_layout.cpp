// rank_layout.cpp: Megatron's decoder and expert rank generators over one world.
#include "parallel/rank_layout.h"

#include <stdexcept>

namespace mt {
namespace {

std::string order_string(bool tp_pp_dp) { return tp_pp_dp ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp"; }

}  // namespace

RankLayout::RankLayout(const LayoutSizes& s)
    : sizes_(s),
      dense_(s.tp, s.cp, 1, s.dp, s.pp, order_string(s.tp_pp_dp_order)),
      expert_(s.etp, 1, s.ep, s.edp, s.pp, order_string(s.tp_pp_dp_order)) {
  if (dense_.world_size() != expert_.world_size()) {
    throw std::invalid_argument("dense grid (" + std::to_string(dense_.world_size()) + " ranks) and expert grid (" +
                                std::to_string(expert_.world_size()) + " ranks) differ");
  }
}

RankLayout RankLayout::from_config(const Config& cfg, int64_t world) {
  LayoutSizes s;
  s.tp = cfg.parallel.tensor_model_parallel_size;
  s.cp = cfg.parallel.context_parallel_size;
  s.pp = cfg.parallel.pipeline_model_parallel_size;
  s.dp = world / (s.tp * s.cp * s.pp);
  s.ep = cfg.parallel.expert_model_parallel_size;
  s.etp = cfg.parallel.expert_tensor_parallel_size.value_or(s.tp);
  s.edp = world / (s.etp * s.ep * s.pp);
  s.tp_pp_dp_order = cfg.parallel.use_tp_pp_dp_mapping;
  return RankLayout(s);
}

std::string RankLayout::order() const { return order_string(sizes_.tp_pp_dp_order); }

RankCoords RankLayout::coords(int64_t r) const {
  RankCoords c;
  c.tp = dense_.coord(r, "tp");
  c.cp = dense_.coord(r, "cp");
  c.dp = dense_.coord(r, "dp");
  c.pp = dense_.coord(r, "pp");
  c.etp = expert_.coord(r, "tp");
  c.ep = expert_.coord(r, "ep");
  c.edp = expert_.coord(r, "dp");
  return c;
}

RankGroups RankLayout::groups(int64_t r) const {
  RankGroups g;
  g.tp = dense_.group_of(r, "tp");
  g.cp = dense_.group_of(r, "cp");
  g.dp = dense_.group_of(r, "dp");
  g.pp = dense_.group_of(r, "pp");
  g.dp_cp = dense_.group_of(r, "dp-cp");
  g.model_parallel = dense_.group_of(r, "tp-pp");
  g.ep = expert_.group_of(r, "ep");
  g.expert_tp = expert_.group_of(r, "tp");
  g.expert_dp = expert_.group_of(r, "dp");
  g.expert_tp_ep = expert_.group_of(r, "tp-ep");
  // Embedding group: the first and last stage of this rank's pipeline, for the tied-embedding all-reduce.
  const auto& pp = g.pp;
  if (r == pp.front() || r == pp.back()) {
    g.embedding = {pp.front()};
    if (pp.size() > 1) g.embedding.push_back(pp.back());
  }
  return g;
}

int64_t RankLayout::megatron_rank(const LayoutSizes& s, int64_t tp, int64_t cp, int64_t dp, int64_t pp) {
  return tp + s.tp * (cp + s.cp * (dp + s.dp * pp));
}

}  // namespace mt
