// process_groups.cpp: see process_groups.h.
#include "comm/process_groups.h"

namespace mt {

ProcessGroups split_layout_groups(const RankLayout& layout, int64_t r, const SplitFn& split) {
  auto group = [&](const char* dims, const char* name) {
    return split(static_cast<int>(layout.dense().group_of(r, dims).front()), static_cast<int>(r), name);
  };
  ProcessGroups g;
  g.tp = group("tp", "tensor-parallel");
  g.dp = group("dp", "data-parallel");
  g.pp = group("pp", "pipeline-parallel");
  g.cp = group("cp", "context-parallel");
  g.dp_cp = group("dp-cp", "data-parallel x context-parallel");
  const RankGroups rg = layout.groups(r);
  g.embedding = split(rg.embedding.empty() ? -1 : static_cast<int>(rg.embedding.front()), static_cast<int>(r), "embedding");
  if (!g.embedding) g.embedding = std::make_shared<SelfCommunicator>();  // not on the first or last stage: never used
  // The expert grid's groups. Where one has the same members as a dense group on every rank (no expert
  // parallelism: expert-TP is TP, expert-DP is DP x CP), it is that group: no second communicator.
  auto same_everywhere = [&](const char* expert_dims, const char* dense_dims) {
    for (int64_t q = 0; q < layout.world_size(); ++q) {
      if (layout.expert().group_of(q, expert_dims) != layout.dense().group_of(q, dense_dims)) return false;
    }
    return true;
  };
  auto expert_group = [&](const char* dims, const char* name) {
    return split(static_cast<int>(layout.expert().group_of(r, dims).front()), static_cast<int>(r), name);
  };
  g.ep = layout.sizes().ep == 1 ? std::make_shared<SelfCommunicator>() : expert_group("ep", "expert-parallel");
  g.expert_tp = same_everywhere("tp", "tp") ? g.tp : expert_group("tp", "expert-tensor-parallel");
  g.expert_dp = same_everywhere("dp", "dp-cp") ? g.dp_cp : expert_group("dp", "expert-data-parallel");
  return g;
}

}  // namespace mt
