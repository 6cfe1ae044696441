// tcp_connect.cpp: the TCP world's set-up (tcp_connect.h) and its bootstrap (make_tcp_world).
#include "comm/tcp_connect.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "comm/tcp_communicator.h"

namespace mt {

using Clock = TcpClock;

namespace {

constexpr const char* kMagic = "megatrain-tcp-1";

int64_t ms_left(Clock::time_point deadline) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

// Blocking helpers for connection set-up (the sockets turn non-blocking once a group is formed).
void send_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

bool recv_all(int fd, void* data, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(ms_left(deadline)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void send_str(int fd, const std::string& s) {
  const uint64_t len = s.size();
  send_all(fd, &len, sizeof(len));
  send_all(fd, s.data(), s.size());
}

// A connection that says nothing is dropped after a few seconds (a port scanner, a stray client), so that it
// cannot hold up the rendezvous until its whole deadline.
Clock::time_point hello_deadline(Clock::time_point deadline) { return std::min(deadline, Clock::now() + std::chrono::seconds(5)); }

bool recv_str(int fd, std::string& s, Clock::time_point deadline, uint64_t max_len = 1u << 24) {
  uint64_t len = 0;
  if (!recv_all(fd, &len, sizeof(len), deadline) || len > max_len) return false;
  s.resize(len);
  return recv_all(fd, s.data(), len, deadline);
}

int listen_on(int port, int* bound) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  if (bound) *bound = ntohs(sa.sin_port);
  return fd;
}

// Connects to host:port, retrying until the deadline (rank 0 may not be listening yet); -1 on timeout.
int connect_to(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  for (;;) {
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) == 0 && res) {
      const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
      const bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0;
      ::freeaddrinfo(res);
      if (ok) return fd;
      if (fd >= 0) ::close(fd);
    }
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string peer_ip(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  char buf[INET_ADDRSTRLEN] = {0};
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || !::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf))) return "";
  return buf;
}

void make_nonblocking(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

}  // namespace

void TcpNode::add(int fd) {
  std::lock_guard<std::mutex> lock(fds_mu);
  fds.push_back(fd);
}

void TcpNode::remove(int fd) {
  std::lock_guard<std::mutex> lock(fds_mu);
  fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
}

void TcpNode::abort_all() {
  if (aborted.exchange(true)) return;
  std::lock_guard<std::mutex> lock(fds_mu);
  for (int fd : fds) ::shutdown(fd, SHUT_RDWR);
}

TcpNode::~TcpNode() {
  if (listen_fd >= 0) ::close(listen_fd);
  for (auto& [k, fd] : pending) ::close(fd);
}

int TcpNode::claim(const std::string& uid, int64_t from, TcpClock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mu);
  for (;;) {
    auto it = pending.find({uid, from});
    if (it != pending.end()) {
      const int fd = it->second;
      pending.erase(it);
      return fd;
    }
    pollfd pfd{listen_fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(ms_left(deadline)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw std::runtime_error("world rank " + std::to_string(from) + " did not connect to world rank " + std::to_string(world_rank) +
                               " within " + std::to_string(setup_timeout_s) + " s (it has probably failed)");
    }
    const int c = ::accept(listen_fd, nullptr, nullptr);
    if (c < 0) continue;
    std::string hello;
    if (!recv_str(c, hello, hello_deadline(deadline), 4096) || hello.rfind(std::string(kMagic) + " ", 0) != 0) {
      ::close(c);  // not one of ours
      continue;
    }
    const size_t sp = hello.rfind(' ');
    char* end = nullptr;
    const long long from_rank = std::strtoll(hello.c_str() + sp + 1, &end, 10);
    if (sp <= std::strlen(kMagic) || *end != '\0' || end == hello.c_str() + sp + 1) {
      ::close(c);
      continue;
    }
    const std::string guid = hello.substr(std::strlen(kMagic) + 1, sp - std::strlen(kMagic) - 1);
    const auto key = std::make_pair(guid, static_cast<int64_t>(from_rank));
    if (pending.count(key)) ::close(pending[key]);
    pending[key] = c;
  }
}

std::vector<int> connect_group(TcpNode& node, const std::string& uid, const std::vector<int64_t>& members, int me) {
  const auto deadline = Clock::now() + std::chrono::seconds(node.setup_timeout_s);
  std::vector<int> fds(members.size(), -1);
  try {
    for (size_t j = static_cast<size_t>(me) + 1; j < members.size(); ++j) {
      const int64_t w = members[j];
      fds[j] = connect_to(node.hosts[static_cast<size_t>(w)], node.ports[static_cast<size_t>(w)], deadline);
      if (fds[j] < 0) {
        throw std::runtime_error("cannot connect to world rank " + std::to_string(w) + " at " + node.hosts[static_cast<size_t>(w)] + ":" +
                                 std::to_string(node.ports[static_cast<size_t>(w)]) + " (" + std::strerror(errno) +
                                 "; a firewall between the nodes, or too few file descriptors: ulimit -n)");
      }
      send_str(fds[j], std::string(kMagic) + " " + uid + " " + std::to_string(node.world_rank));
    }
    for (int j = 0; j < me; ++j) fds[static_cast<size_t>(j)] = node.claim(uid, members[static_cast<size_t>(j)], deadline);
  } catch (...) {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    throw;
  }
  for (int fd : fds) {
    if (fd >= 0) make_nonblocking(fd);
  }
  return fds;
}

int rendezvous_port(const LaunchInfo& launch, const EnvLookup& env) {
  if (auto v = env("MEGATRAIN_RENDEZVOUS_PORT")) {
    char* end = nullptr;
    const long p = std::strtol(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || p <= 0 || p > 65535) {
      throw std::runtime_error("MEGATRAIN_RENDEZVOUS_PORT='" + *v + "' is not a port number (1-65535)");
    }
    return static_cast<int>(p);
  }
  return env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True" ? launch.master_port + 1 : launch.master_port;
}

namespace {

// Closes the sockets it holds when it goes.
struct FdSet {
  std::vector<int> fds;
  ~FdSet() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
};

const char* const kFix = " (MASTER_ADDR / MASTER_PORT; MEGATRAIN_RENDEZVOUS_PORT picks another port)";

// Rank 0: every other rank reports its listening port at the rendezvous; the table goes back to all.
void serve_table(TcpNode& node, int port, TcpClock::time_point deadline, const std::string& where) {
  const size_t W = node.ports.size();
  FdSet open;
  open.fds.push_back(listen_on(port, nullptr));
  if (open.fds[0] < 0) throw std::runtime_error("rank 0 cannot listen at " + where + ": " + std::strerror(errno) + kFix);
  std::vector<int> conns;
  while (conns.size() + 1 < W) {
    pollfd pfd{open.fds[0], POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(ms_left(deadline)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw std::runtime_error("only " + std::to_string(conns.size()) + " of " + std::to_string(W - 1) + " ranks reached " + where + " in " +
                               std::to_string(node.setup_timeout_s) + " s" + kFix);
    }
    const int c = ::accept(open.fds[0], nullptr, nullptr);
    if (c < 0) continue;
    open.fds.push_back(c);
    std::string hello;
    long long r_peer = -1, p_peer = 0;
    char magic[32] = {0};
    if (!recv_str(c, hello, hello_deadline(deadline), 4096) || std::sscanf(hello.c_str(), "%31s %lld %lld", magic, &r_peer, &p_peer) != 3 ||
        std::string(magic) != kMagic || r_peer <= 0 || r_peer >= static_cast<long long>(W) || node.ports[static_cast<size_t>(r_peer)] != 0) {
      continue;  // a stray client, or a rank twice (closed with the rest)
    }
    node.hosts[static_cast<size_t>(r_peer)] = peer_ip(c);
    node.ports[static_cast<size_t>(r_peer)] = static_cast<int>(p_peer);
    conns.push_back(c);
  }
  std::string table = std::string(kMagic) + "\n";
  for (size_t r = 0; r < W; ++r) table += node.hosts[r] + " " + std::to_string(node.ports[r]) + "\n";
  for (int c : conns) send_str(c, table);
}

// Ranks 1..: report this rank's listening port at the rendezvous and read the table.
void join_table(TcpNode& node, const LaunchInfo& launch, int port, int my_port, TcpClock::time_point deadline, const std::string& where) {
  FdSet open;
  open.fds.push_back(connect_to(launch.master_addr, port, deadline));
  if (open.fds[0] < 0) {
    throw std::runtime_error("rank " + std::to_string(launch.rank) + " could not reach " + where + " in " + std::to_string(node.setup_timeout_s) +
                             " s: is rank 0 running?" + kFix);
  }
  std::string got;
  bool ok = true;
  try {
    send_str(open.fds[0], std::string(kMagic) + " " + std::to_string(launch.rank) + " " + std::to_string(my_port));
    ok = recv_str(open.fds[0], got, deadline);
  } catch (const std::exception&) {
    ok = false;
  }
  if (!ok || got.rfind(std::string(kMagic) + "\n", 0) != 0) {
    throw std::runtime_error(where + " did not answer as megatrain's rank 0 (another service on that port, such as torchrun's agent store, "
                             "or rank 0 failed)" + kFix);
  }
  std::istringstream in(got.substr(std::strlen(kMagic) + 1));
  for (size_t r = 0; r < node.ports.size(); ++r) in >> node.hosts[r] >> node.ports[r];
  if (!in) throw std::runtime_error(where + " sent a malformed address table (mixed megatrain versions?)");
}

}  // namespace

std::shared_ptr<TcpCommunicator> make_tcp_world(const LaunchInfo& launch, int port, int64_t timeout_seconds, int64_t op_timeout_seconds) {
  // A group holds a socket per other member: let this process have as many descriptors as it may.
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  auto node = std::make_shared<TcpNode>();
  node->world_rank = launch.rank;
  node->setup_timeout_s = std::max<int64_t>(timeout_seconds, 1);
  const auto deadline = Clock::now() + std::chrono::seconds(node->setup_timeout_s);
  const std::string where = "the rendezvous at " + launch.master_addr + ":" + std::to_string(port);
  int my_port = 0;
  node->listen_fd = listen_on(0, &my_port);
  if (node->listen_fd < 0) throw std::runtime_error(std::string("cannot listen on a TCP port: ") + std::strerror(errno));
  const size_t W = static_cast<size_t>(launch.world_size);
  node->hosts.assign(W, "");
  node->ports.assign(W, 0);
  if (launch.rank == 0) {
    node->hosts[0] = launch.master_addr;
    node->ports[0] = my_port;
    if (W > 1) serve_table(*node, port, deadline, where);
  } else {
    join_table(*node, launch, port, my_port, deadline, where);
  }
  std::vector<int64_t> members(W);
  for (size_t r = 0; r < W; ++r) members[r] = static_cast<int64_t>(r);
  auto fds = connect_group(*node, "w", members, static_cast<int>(launch.rank));
  return std::make_shared<TcpCommunicator>(node, "w", "world", members, static_cast<int>(launch.rank), std::move(fds),
                                           op_timeout_seconds < 0 ? timeout_seconds : op_timeout_seconds);
}

}  // namespace mt
