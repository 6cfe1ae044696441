// test_rendezvous.cpp: the TCP rendezvous that carries the NCCL unique id for torchrun-style launches.
#include <unistd.h>

#include <random>
#include <thread>
#include <vector>

#include "catch.h"
#include "comm/tcp_rendezvous.h"

using namespace mt;

TEST_CASE("TCP rendezvous: rank 0's bytes reach every rank") {
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::string blob(128, '\0');
  std::mt19937 gen(5);
  for (auto& c : blob) c = static_cast<char>(gen());
  std::vector<std::string> got(4);
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r) {  // peers first: they retry until rank 0 listens
    ranks.emplace_back([&, r] { got[static_cast<size_t>(r)] = tcp_rendezvous_broadcast(r == 0 ? blob : "", "127.0.0.1", port, r, 4, 20); });
  }
  for (auto& t : ranks) t.join();
  for (const auto& g : got) CHECK(g == blob);
}

TEST_CASE("TCP rendezvous: a missing rank 0 is an error naming the address, within the timeout") {
  try {
    tcp_rendezvous_broadcast("", "127.0.0.1", 1, 1, 2, 1);
    FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find("rendezvous at 127.0.0.1:1") == 0);
  }
}
