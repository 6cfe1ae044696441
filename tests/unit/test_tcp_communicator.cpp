// test_tcp_communicator.cpp: the TCP world of torchrun-style launches: threads play the ranks on
// localhost (each its own world, as separate processes would).
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "catch.h"
#include "comm/tcp_communicator.h"

using namespace mt;

namespace {

std::atomic<int> g_next_port{0};

int fresh_port() {
  // Below the kernel's ephemeral range (32768 on): no outgoing connection holds it.
  if (g_next_port.load() == 0) g_next_port = 21000 + static_cast<int>(::getpid() % 10000);
  return g_next_port.fetch_add(7);
}

// Catch's assertions are not thread-safe: the ranks throw, and the main thread reports.
#define RANK_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) throw std::runtime_error("line " + std::to_string(__LINE__) + ": " #cond); \
  } while (0)

LaunchInfo launch_of(int rank, int world, int port) {
  LaunchInfo l;
  l.kind = LauncherKind::kTorchrun;
  l.rank = rank;
  l.world_size = world;
  l.master_addr = "127.0.0.1";
  l.master_port = port;
  return l;
}

// Runs body(world) on `world` threads, each with its own TCP world; rethrows the first failure.
void run_ranks(int world, const std::function<void(TcpCommunicator&)>& body, int64_t timeout = 20) {
  const int port = fresh_port();
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = world - 1; r >= 0; --r) {  // peers first: they retry until rank 0 listens
    ts.emplace_back([&, r] {
      try {
        auto w = make_tcp_world(launch_of(r, world, port), port, timeout);
        body(*w);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& e : errors) {
    INFO(e);
    CHECK(e.empty());
  }
}

}  // namespace

TEST_CASE("TCP world: every collective, uneven sizes, 3 and 4 ranks") {
  for (int W : {3, 4}) {
    run_ranks(W, [W](TcpCommunicator& c) {
      const int R = c.rank();
      RANK_CHECK(c.size() == W);
      // all-reduce: sum, avg, max over an odd length (blocks of unequal size); doubles too
      const int64_t n = 100003;
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i % 97) + 0.5f * static_cast<float>(R);
      auto s = v;
      c.all_reduce(s.data(), n, ReduceOp::kSum);
      auto a = v;
      c.all_reduce_async(a.data(), n, ReduceOp::kAvg)->wait();
      auto m = v;
      c.all_reduce(m.data(), n, ReduceOp::kMax);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i) {
        const float base = static_cast<float>(i % 97);
        const float sum = static_cast<float>(W) * base + 0.5f * static_cast<float>(W * (W - 1) / 2);
        ok &= std::fabs(s[static_cast<size_t>(i)] - sum) <= 1e-4f * sum + 1e-6f;
        ok &= std::fabs(a[static_cast<size_t>(i)] - sum / static_cast<float>(W)) <= 1e-4f * sum + 1e-6f;
        ok &= m[static_cast<size_t>(i)] == base + 0.5f * static_cast<float>(W - 1);
      }
      RANK_CHECK(ok);
      std::vector<double> d{1.0 * R, 2.0, -3.0 * R};
      c.all_reduce(d.data(), 3, ReduceOp::kSum);
      RANK_CHECK(d[0] == W * (W - 1) / 2.0);
      RANK_CHECK(d[1] == 2.0 * W);
      // reduce-scatter (even) and all-gather back
      const int64_t blk = 5;
      std::vector<float> full(static_cast<size_t>(blk * W)), part(static_cast<size_t>(blk));
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i + static_cast<size_t>(R));
      c.reduce_scatter(full.data(), part.data(), blk, ReduceOp::kSum);
      for (int64_t i = 0; i < blk; ++i) RANK_CHECK(part[static_cast<size_t>(i)] == static_cast<float>(W * (R * blk + i) + W * (W - 1) / 2));
      std::vector<float> mine(static_cast<size_t>(blk), static_cast<float>(R + 1)), all(static_cast<size_t>(blk * W));
      c.all_gather_async(mine.data(), all.data(), blk)->wait();
      for (int r = 0; r < W; ++r) RANK_CHECK(all[static_cast<size_t>(r * blk + blk - 1)] == static_cast<float>(r + 1));
      // uneven blocks, in place (the distributed optimizer's buckets)
      std::vector<int64_t> counts;
      for (int r = 0; r < W; ++r) counts.push_back(r + 2);
      int64_t total = 0, off = 0;
      for (int r = 0; r < W; ++r) {
        if (r < R) off += counts[static_cast<size_t>(r)];
        total += counts[static_cast<size_t>(r)];
      }
      std::vector<float> buf(static_cast<size_t>(total), 1.0f);
      c.reduce_scatter_v_async(buf.data(), buf.data() + off, counts, ReduceOp::kAvg)->wait();
      for (int64_t i = 0; i < counts[static_cast<size_t>(R)]; ++i) buf[static_cast<size_t>(off + i)] = static_cast<float>(R);
      c.all_gather_v_async(buf.data() + off, buf.data(), counts)->wait();
      int64_t at = 0;
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) RANK_CHECK(buf[static_cast<size_t>(at++)] == static_cast<float>(r));
      }
      // all-to-all: block p of rank r holds 10 r + p
      std::vector<float> x(static_cast<size_t>(W * 2)), y(static_cast<size_t>(W * 2));
      for (int p = 0; p < W; ++p) x[static_cast<size_t>(2 * p)] = x[static_cast<size_t>(2 * p + 1)] = static_cast<float>(10 * R + p);
      c.all_to_all(x.data(), y.data(), 2);
      for (int p = 0; p < W; ++p) RANK_CHECK(y[static_cast<size_t>(2 * p)] == static_cast<float>(10 * p + R));
      // send / recv around a ring, everyone sending first (a large message: no pair waits on the other)
      std::vector<float> out(1 << 20, static_cast<float>(R)), in(1 << 20);
      c.send(out.data(), 1 << 20, (R + 1) % W);
      c.recv(in.data(), 1 << 20, (R + W - 1) % W);
      RANK_CHECK(in.back() == static_cast<float>((R + W - 1) % W));
      // broadcast, strings, barrier
      int64_t token = R == 1 ? 4242 : 0;
      c.broadcast(&token, sizeof(token), 1);
      RANK_CHECK(token == 4242);
      const auto strs = c.all_gather_strings(std::string(static_cast<size_t>(R), 'x'));
      for (int r = 0; r < W; ++r) RANK_CHECK(strs[static_cast<size_t>(r)] == std::string(static_cast<size_t>(r), 'x'));
      c.barrier();
    });
  }
}

TEST_CASE("TCP world: groups split from it are independent, ordered by key") {
  run_ranks(4, [](TcpCommunicator& w) {
    const int R = w.rank();
    auto pair = w.split(R / 2, -R, "pairs");  // {0, 1} and {2, 3}, the higher world rank first
    RANK_CHECK(pair);
    RANK_CHECK(pair->size() == 2);
    RANK_CHECK(pair->rank() == 1 - R % 2);
    auto none = w.split(R == 3 ? 0 : -1, 0, "only 3");
    RANK_CHECK((R == 3) == (none != nullptr));
    auto dup = w.split(0, R, "checkpoint", 0);
    // a collective on the duplicate from another thread while the pairs talk: no interleaving
    std::vector<std::string> got;
    std::string bg_error;
    std::thread bg([&] {
      try {
        got = dup->all_gather_strings(std::to_string(R));
      } catch (const std::exception& e) {
        bg_error = e.what();
      }
    });
    float v = static_cast<float>(R);
    pair->all_reduce(&v, 1, ReduceOp::kSum);
    bg.join();
    if (!bg_error.empty()) throw std::runtime_error(bg_error);
    RANK_CHECK(v == static_cast<float>(R / 2 * 4 + 1));
    RANK_CHECK(got.size() == 4);
    RANK_CHECK(got[3] == "3");
  });
}

TEST_CASE("TCP world: a rank that leaves is named by the others, and a missing rank 0 within the timeout") {
  run_ranks(3, [](TcpCommunicator& w) {
    if (w.rank() == 2) return;  // leaves: its sockets close
    float v = 1;
    try {
      w.all_reduce(&v, 1, ReduceOp::kSum);
      throw std::logic_error("expected an error");
    } catch (const std::runtime_error& e) {
      // rank 2's closed socket, or the other survivor's once it gave up
      RANK_CHECK(std::string(e.what()).find("world rank ") == 0);
      RANK_CHECK(std::string(e.what()).find(": all-reduce on the world group (TCP): its rank ") != std::string::npos);
      RANK_CHECK(std::string(e.what()).find("it has probably failed") != std::string::npos);
    }
  });
  try {
    make_tcp_world(launch_of(1, 2, 1), 1, 1);
    throw std::logic_error("expected an error");
  } catch (const std::runtime_error& e) {
    RANK_CHECK(std::string(e.what()).find("rank 1 could not reach the rendezvous at 127.0.0.1:1 in 1 s") == 0);
  }
}

TEST_CASE("TCP world: a stalled collective times out naming the group, and ends this rank's other waits") {
  run_ranks(
      2,
      [](TcpCommunicator& w) {
        auto dup = w.split(0, w.rank(), "checkpoint", 0);  // no timeout of its own
        if (w.rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(6000));
          return;
        }
        // A background wait on the group without timeout (a save) ends once the main thread's fails.
        const auto t0 = std::chrono::steady_clock::now();
        std::string bg_error;
        double bg_seconds = 0;
        std::thread bg([&] {
          try {
            dup->barrier();
          } catch (const std::exception& e) {
            bg_error = e.what();
          }
          bg_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
        try {
          w.barrier();
          throw std::logic_error("expected a timeout");
        } catch (const std::runtime_error& e) {
          RANK_CHECK(std::string(e.what()).find("world rank 0: all-gather on the world group (TCP): waited more than 2 s") == 0);
        }
        bg.join();
        RANK_CHECK(bg_error.find("on the checkpoint group (TCP): given up: this rank already failed in another group") != std::string::npos);
        RANK_CHECK(bg_seconds < 5.5);
      },
      2);
}

TEST_CASE("rendezvous port: MEGATRAIN_RENDEZVOUS_PORT, else beside torchrun's agent store, else MASTER_PORT") {
  const LaunchInfo l = launch_of(0, 2, 29500);
  auto env = [](std::map<std::string, std::string> m) {
    return EnvLookup([m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      if (it == m.end()) return std::nullopt;
      return it->second;
    });
  };
  CHECK(rendezvous_port(l, env({})) == 29500);
  CHECK(rendezvous_port(l, env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}})) == 29501);
  CHECK(rendezvous_port(l, env({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})) == 29500);
  CHECK(rendezvous_port(l, env({{"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"MEGATRAIN_RENDEZVOUS_PORT", "31000"}})) == 31000);
  CHECK_THROWS_WITH(rendezvous_port(l, env({{"MEGATRAIN_RENDEZVOUS_PORT", "x"}})), MT_CONTAINS("not a port number"));
}
