// process_groups.h: a rank layout's groups, built the same way over every transport (MPI, TCP, NCCL):
// each group a split of the world with the group's first world rank as color and the world rank as key.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "parallel/rank_layout.h"

namespace mt {

// split(color, key, name): MPI_Comm_split's contract, collective over the world; color -1: not a member
// (returns nullptr).
using SplitFn = std::function<std::shared_ptr<Communicator>(int color, int key, const std::string& name)>;

// TP, DP, PP, CP, DP x CP, the embedding group (a self group off the first and last stages), then EP,
// expert-TP and expert-DP (each the dense group it equals where it has the same members) of world rank r,
// split in that order on every rank; world and checkpoint are left to the caller.
ProcessGroups split_layout_groups(const RankLayout& layout, int64_t r, const SplitFn& split);

}  // namespace mt
