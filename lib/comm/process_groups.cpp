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
  return g;
}

}  // namespace mt
