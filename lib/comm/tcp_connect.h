// tcp_connect.h: connection set-up of the TCP world (comm/tcp_communicator.h), internal to lib/comm:
// this process's listener, the world's address table, and the handshake that gives each group a
// connection of its own per pair of members.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace mt {

using TcpClock = std::chrono::steady_clock;

struct TcpNode {
  int listen_fd = -1;
  int64_t world_rank = 0;
  int64_t setup_timeout_s = 60;
  std::vector<std::string> hosts;  // by world rank
  std::vector<int> ports;
  std::mutex mu;
  std::map<std::pair<std::string, int64_t>, int> pending;  // (group uid, world rank) -> accepted, not yet claimed
  // Every group's sockets: the first failure shuts them all down, so another thread's wait (a background
  // save's, on a peer that stopped) ends too instead of holding the exit forever.
  std::mutex fds_mu;
  std::vector<int> fds;
  std::atomic<bool> aborted{false};

  void add(int fd);
  void remove(int fd);
  void abort_all();
  ~TcpNode();
  // The connection member `from` of group `uid` opened to this rank (accepting others' on the way).
  int claim(const std::string& uid, int64_t from, TcpClock::time_point deadline);
};

// Connections to every other member of a group (group order `members`, this rank at index me), made
// non-blocking; throws naming the member that could not be reached.
std::vector<int> connect_group(TcpNode& node, const std::string& uid, const std::vector<int64_t>& members, int me);

}  // namespace mt
