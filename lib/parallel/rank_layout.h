// rank_layout.h: the dense grid (TP x CP x DP x PP) and the expert grid (ETP x EP x EDP x PP) of a
// configuration, each rank's coordinates and the members of each of its process groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/rank_grid.h"

namespace mt {

struct RankCoords {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;     // dense grid
  int64_t etp = 0, ep = 0, edp = 0;           // expert grid (pp shared)
};

struct RankGroups {
  std::vector<int64_t> tp, cp, dp, pp, dp_cp, model_parallel;  // dense (model parallel = TP x PP)
  std::vector<int64_t> ep, expert_tp, expert_dp, expert_tp_ep;         // expert
  std::vector<int64_t> embedding;  // first and last stage of this rank's pipeline (empty if not on one)
};

struct LayoutSizes {
  int64_t tp = 1, cp = 1, pp = 1, dp = 1, ep = 1, etp = 1, edp = 1;
  bool tp_pp_dp_order = false;
};

class RankLayout {
 public:
  explicit RankLayout(const LayoutSizes& sizes);
  // From a validated, resolved config and the world size.
  static RankLayout from_config(const Config& cfg, int64_t world_size);

  const LayoutSizes& sizes() const { return sizes_; }
  int64_t world_size() const { return dense_.world_size(); }
  std::string order() const;
  RankCoords coords(int64_t rank) const;
  RankGroups groups(int64_t rank) const;
  const RankGrid& dense() const { return dense_; }
  const RankGrid& expert() const { return expert_; }
  // Megatron's formula for the default order: rank = tp + TP*(cp + CP*(dp + DP*pp)).
  static int64_t megatron_rank(const LayoutSizes& s, int64_t tp, int64_t cp, int64_t dp, int64_t pp);

 private:
  LayoutSizes sizes_;
  RankGrid dense_;
  RankGrid expert_;
};

}  // namespace mt
