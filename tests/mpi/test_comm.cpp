// test_comm.cpp: what pipeline, expert and context parallelism need of every host communicator, under
// mpirun (MPI groups) and torchrun-style (TCP groups): batched point-to-point transfers (a ring in both
// directions with uneven sizes, empty and self transfers), the all-to-all with per-rank counts (zero counts
// included) and the expert process groups against the rank layout. Prints PASS / FAIL lines; exit 1 on any failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/tcp_communicator.h"
#include "parallel/launcher.h"
#include "parallel/rank_layout.h"

using namespace mt;

namespace {

int failures = 0;
void expect(bool ok, const std::string& what, int64_t rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %lld: FAIL %s\n", static_cast<long long>(rank), what.c_str());
    ++failures;
  }
}

// A value that names its sender, receiver and position: exact in fp32.
float tag(int from, int to, int64_t i) { return static_cast<float>(from * 1000 + to * 100 + i % 97); }

void p2p(Communicator& c, const std::string& group) {
  const int R = c.rank(), W = c.size(), next = (R + 1) % W, prev = (R + W - 1) % W;
  // Sizes depend on the sender: the receiver knows them (n(from) = 5 + 3 * from, rank 0 sends nothing).
  auto n_of = [](int from) { return from == 0 ? int64_t{0} : 5 + 3 * int64_t{from}; };
  std::vector<float> to_next(static_cast<size_t>(n_of(R))), to_prev(static_cast<size_t>(n_of(R)) + 1);
  for (int64_t i = 0; i < n_of(R); ++i) to_next[static_cast<size_t>(i)] = tag(R, next, i);
  for (int64_t i = 0; i <= n_of(R); ++i) to_prev[static_cast<size_t>(i)] = tag(R, prev, i);
  std::vector<float> from_prev(static_cast<size_t>(n_of(prev)), -1.0f), from_next(static_cast<size_t>(n_of(next)) + 1, -1.0f);
  // Both directions at once: every rank sends before it receives, which only a batch allows.
  auto req = c.send_recv_batch_async({P2POp::send(to_next.data(), n_of(R), next), P2POp::send(to_prev.data(), n_of(R) + 1, prev),
                                      P2POp::recv(from_prev.data(), n_of(prev), prev), P2POp::recv(from_next.data(), n_of(next) + 1, next)});
  req->wait();
  req->wait();  // idempotent
  bool ok = true;
  for (int64_t i = 0; i < n_of(prev); ++i) ok &= from_prev[static_cast<size_t>(i)] == tag(prev, R, i);
  for (int64_t i = 0; i <= n_of(next); ++i) ok &= from_next[static_cast<size_t>(i)] == tag(next, R, i);
  expect(ok, "batched send / receive ring, both directions, on the " + group + " group", R);
  // Two transfers to the same peer meet in posting order; one to itself.
  std::vector<float> a(7, static_cast<float>(R)), b(3, static_cast<float>(R + 50)), ga(7), gb(3), self_in(4, 9.0f), self_out(4);
  c.send_recv_batch_async({P2POp::send(a.data(), 7, next), P2POp::send(b.data(), 3, next), P2POp::send(self_in.data(), 4, R),
                           P2POp::recv(ga.data(), 7, prev), P2POp::recv(gb.data(), 3, prev), P2POp::recv(self_out.data(), 4, R)})
      ->wait();
  expect(ga == std::vector<float>(7, static_cast<float>(prev)) && gb == std::vector<float>(3, static_cast<float>(prev + 50)) &&
             self_out == self_in,
         "batched transfers in posting order, and to itself, on the " + group + " group", R);
}

void all_to_all_v(Communicator& c, const std::string& group) {
  const int R = c.rank(), W = c.size();
  // count(from, to): what `from` sends `to`; zero for some pairs.
  auto count = [](int from, int to) { return (from + 2 * to) % 3 == 0 ? int64_t{0} : 1 + from + 4 * int64_t{to}; };
  std::vector<int64_t> sc, rc;
  std::vector<float> send;
  for (int to = 0; to < W; ++to) {
    sc.push_back(count(R, to));
    rc.push_back(count(to, R));
    for (int64_t i = 0; i < sc.back(); ++i) send.push_back(tag(R, to, i));
  }
  int64_t total = 0;
  for (int64_t x : rc) total += x;
  std::vector<float> recv(static_cast<size_t>(total) + 1, -1.0f);  // one spare element: nothing writes past the blocks
  c.all_to_all_v(send.data(), sc, recv.data(), rc);
  bool ok = recv.back() == -1.0f;
  size_t at = 0;
  for (int from = 0; from < W; ++from) {
    for (int64_t i = 0; i < rc[static_cast<size_t>(from)]; ++i) ok &= recv[at++] == tag(from, R, i);
  }
  expect(ok, "all-to-all with per-rank counts on the " + group + " group", R);
}

// The members of `g` as world ranks, in group order, from every member.
std::vector<int64_t> members(Communicator& g, int64_t world_rank) {
  std::vector<float> all(static_cast<size_t>(g.size()));
  const float me = static_cast<float>(world_rank);
  g.all_gather(&me, all.data(), 1);
  return std::vector<int64_t>(all.begin(), all.end());
}

}  // namespace

int main(int argc, char** argv) {
  const LaunchInfo launch = detect_launch();
  const bool tcp = launch.kind == LauncherKind::kTorchrun;
  if (!tcp) mpi_initialize(&argc, &argv);
  try {
    const int64_t W = launch.world_size, r = launch.rank;
    std::shared_ptr<TcpCommunicator> world;
    if (tcp) world = make_tcp_world(launch, rendezvous_port(launch), 60);
    // The dense grid as DP over every rank; the expert grid with EP 2 (when it divides the world).
    LayoutSizes sizes;
    sizes.dp = W;
    sizes.ep = W % 2 == 0 ? 2 : 1;
    sizes.edp = W / sizes.ep;
    const RankLayout layout(sizes);
    ProcessGroups g = tcp ? make_tcp_process_groups(world, layout, r) : make_mpi_process_groups(layout, r);
    if (argc > 1 && std::string(argv[1]) == "--last-rank-dies") {
      // The last rank dies in the middle of the ring's exchange: the others must end (the launcher's
      // message, or this communicator's naming it), never hang. A dead rank writes nothing more.
      if (r == W - 1) std::_Exit(3);
      std::vector<float> out(1000, 1.0f), in(1000);
      g.world->send_recv_batch_async({P2POp::send(out.data(), 1000, static_cast<int>((r + 1) % W)),
                                      P2POp::recv(in.data(), 1000, static_cast<int>((r + W - 1) % W))})
          ->wait();
      g.world->all_to_all_v(out.data(), std::vector<int64_t>(static_cast<size_t>(W), 10), in.data(), std::vector<int64_t>(static_cast<size_t>(W), 10));
      expect(false, "the exchange with a dead rank completed", r);
    }
    p2p(*g.world, "world");
    p2p(*g.dp, "data-parallel");
    all_to_all_v(*g.world, "world");
    const RankGroups want = layout.groups(r);
    expect(members(*g.ep, r) == want.ep, "expert-parallel group members", r);
    expect(members(*g.expert_dp, r) == want.expert_dp, "expert-data-parallel group members", r);
    expect(members(*g.expert_tp, r) == want.expert_tp, "expert-tensor-parallel group members", r);
    expect(g.expert_tp == g.tp, "expert-TP is the TP group where they have the same members", r);
    expect((g.expert_dp == g.dp_cp) == (sizes.ep == 1), "expert-DP is DP x CP exactly without expert parallelism", r);
    if (g.ep->size() > 1) all_to_all_v(*g.ep, "expert-parallel");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %lld: FAIL %s\n", static_cast<long long>(launch.rank), e.what());
    ++failures;
  }
  if (failures == 0) std::printf("rank %lld: PASS (%s)\n", static_cast<long long>(launch.rank), tcp ? "TCP" : "MPI");
  if (!tcp) mpi_finalize();
  return failures ? 1 : 0;
}
