// test_rank_layout.cpp: rank layouts against hand-worked examples and Megatron's rank formula.
#include "catch.h"
#include "parallel/rank_layout.h"

using namespace mt;
using V = std::vector<int64_t>;

TEST_CASE("16 ranks TP2 PP2 DP4 (order tp-cp-ep-dp-pp)") {
  LayoutSizes s;
  s.tp = 2; s.pp = 2; s.dp = 4; s.etp = 2; s.edp = 4;
  RankLayout l(s);
  REQUIRE(l.world_size() == 16);
  // rank = tp + 2*(dp + 4*pp): rank 11 = tp 1, dp 1, pp 1.
  const RankCoords c = l.coords(11);
  CHECK(c.tp == 1);
  CHECK(c.dp == 1);
  CHECK(c.pp == 1);
  const RankGroups g = l.groups(11);
  CHECK(g.tp == V{10, 11});
  CHECK(g.dp == V{9, 11, 13, 15});
  CHECK(g.pp == V{3, 11});
  CHECK(g.dp_cp == V{9, 11, 13, 15});
  CHECK(g.model_parallel == V{2, 3, 10, 11});
  CHECK(g.embedding == V{3, 11});
  CHECK(l.groups(0).tp == V{0, 1});
  CHECK(l.groups(0).pp == V{0, 8});
  CHECK(l.dense().groups("tp").size() == 8);
  CHECK(l.dense().groups("dp").size() == 4);
  for (int64_t r = 0; r < 16; ++r) {
    const RankCoords k = l.coords(r);
    CHECK(RankLayout::megatron_rank(s, k.tp, k.cp, k.dp, k.pp) == r);
  }
}

TEST_CASE("32 ranks TP2 EP4: the expert grid folds EP into the data-parallel ranks") {
  LayoutSizes s;
  s.tp = 2; s.dp = 16; s.ep = 4; s.etp = 2; s.edp = 4;
  RankLayout l(s);
  REQUIRE(l.world_size() == 32);
  // Expert grid order tp-ep-dp: rank = etp + 2*(ep + 4*edp).
  const RankCoords c = l.coords(13);
  CHECK(c.etp == 1);
  CHECK(c.ep == 2);
  CHECK(c.edp == 1);
  const RankGroups g = l.groups(13);
  CHECK(g.ep == V{9, 11, 13, 15});
  CHECK(g.expert_tp == V{12, 13});
  CHECK(g.expert_dp == V{5, 13, 21, 29});
  CHECK(g.expert_tp_ep == V{8, 9, 10, 11, 12, 13, 14, 15});
  CHECK(g.dp.size() == 16);
  CHECK(g.tp == V{12, 13});
  CHECK(g.embedding == V{13});  // PP 1: every rank holds embedding and output
}

TEST_CASE("CP sits between TP and DP; DP x CP group") {
  LayoutSizes s;
  s.tp = 2; s.cp = 2; s.dp = 2; s.etp = 2; s.edp = 4;
  RankLayout l(s);
  const RankGroups g = l.groups(5);  // tp 1, cp 0, dp 1
  CHECK(g.cp == V{5, 7});
  CHECK(g.dp == V{1, 5});
  CHECK(g.dp_cp == V{1, 3, 5, 7});
  for (int64_t r = 0; r < 8; ++r) {
    const RankCoords k = l.coords(r);
    CHECK(RankLayout::megatron_rank(s, k.tp, k.cp, k.dp, k.pp) == r);
  }
}

TEST_CASE("--use-tp-pp-dp-mapping puts PP before DP") {
  LayoutSizes s;
  s.tp = 2; s.pp = 2; s.dp = 2; s.etp = 2; s.edp = 2; s.tp_pp_dp_order = true;
  RankLayout l(s);
  CHECK(l.order() == "tp-cp-ep-pp-dp");
  CHECK(l.groups(0).pp == V{0, 2});
  CHECK(l.groups(0).dp == V{0, 4});
}

TEST_CASE("every rank is in exactly one group of each kind") {
  LayoutSizes s;
  s.tp = 2; s.pp = 3; s.dp = 2; s.cp = 2; s.etp = 1; s.ep = 4; s.edp = 2;
  RankLayout l(s);
  for (const char* dims : {"tp", "pp", "dp", "cp", "dp-cp", "tp-pp"}) {
    std::vector<int> seen(static_cast<size_t>(l.world_size()), 0);
    for (const auto& grp : l.dense().groups(dims)) {
      for (auto r : grp) seen[static_cast<size_t>(r)]++;
    }
    for (auto n : seen) CHECK(n == 1);
  }
  for (const char* dims : {"tp", "ep", "dp"}) {
    std::vector<int> seen(static_cast<size_t>(l.world_size()), 0);
    for (const auto& grp : l.expert().groups(dims)) {
      for (auto r : grp) seen[static_cast<size_t>(r)]++;
    }
    for (auto n : seen) CHECK(n == 1);
  }
  // The pipeline groups of both grids agree.
  for (int64_t r = 0; r < l.world_size(); ++r) CHECK(l.dense().group_of(r, "pp") == l.expert().group_of(r, "pp"));
}
