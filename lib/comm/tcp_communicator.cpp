// tcp_communicator.cpp: the TCP world of torchrun-style launches (see tcp_communicator.h).
#include "comm/tcp_communicator.h"

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
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace mt {

using Clock = std::chrono::steady_clock;

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

  void add(int fd) {
    std::lock_guard<std::mutex> lock(fds_mu);
    fds.push_back(fd);
  }
  void remove(int fd) {
    std::lock_guard<std::mutex> lock(fds_mu);
    fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
  }
  void abort_all() {
    if (aborted.exchange(true)) return;
    std::lock_guard<std::mutex> lock(fds_mu);
    for (int fd : fds) ::shutdown(fd, SHUT_RDWR);
  }

  ~TcpNode() {
    if (listen_fd >= 0) ::close(listen_fd);
    for (auto& [k, fd] : pending) ::close(fd);
  }

  // The connection member `from` of group `uid` opened to this rank (accepting others' on the way).
  int claim(const std::string& uid, int64_t from, Clock::time_point deadline) {
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
      if (!recv_str(c, hello, deadline, 4096) || hello.rfind(std::string(kMagic) + " ", 0) != 0) {
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
};

namespace {

// Connections to every other member of a group (group order `members`, this rank at index me).
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

}  // namespace

struct TcpCommunicator::Peer {
  int fd = -1;
  std::string out;  // framed bytes not yet sent, from out_off
  size_t out_off = 0;
  std::string in;  // bytes received, not yet a whole frame, from in_off
  size_t in_off = 0;
  std::deque<std::string> frames;
  std::string gone;  // why the connection ended (the frames before it still count)
};

TcpCommunicator::TcpCommunicator(std::shared_ptr<TcpNode> node, std::string uid, std::string name, std::vector<int64_t> members, int rank,
                                 std::vector<int> fds, int64_t timeout_seconds)
    : node_(std::move(node)), uid_(std::move(uid)), name_(std::move(name)), members_(std::move(members)), rank_(rank),
      timeout_s_(timeout_seconds) {
  for (int fd : fds) {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->fd = fd;
    if (fd >= 0) node_->add(fd);
  }
}

TcpCommunicator::~TcpCommunicator() {
  for (auto& p : peers_) {
    if (p->fd < 0) continue;
    node_->remove(p->fd);
    ::close(p->fd);
  }
}

void TcpCommunicator::fail(const std::string& why, const char* what) const {
  const bool first = !node_->aborted.load();
  node_->abort_all();
  throw std::runtime_error("world rank " + std::to_string(node_->world_rank) + ": " + what + " on the " + name_ + " group (TCP): " +
                           (first ? why : "given up: this rank already failed in another group"));
}

void TcpCommunicator::post(int peer, const void* data, size_t bytes) {
  Peer& p = *peers_[static_cast<size_t>(peer)];
  const uint64_t len = bytes;
  p.out.append(reinterpret_cast<const char*>(&len), sizeof(len));
  p.out.append(static_cast<const char*>(data), bytes);
}

void TcpCommunicator::progress(const char* what, const std::function<bool()>& done, const std::function<int()>& dead) {
  const auto start = Clock::now();
  std::vector<pollfd> pfds;
  std::vector<size_t> who;
  std::vector<char> buf(1 << 16);
  while (!done()) {
    if (node_->aborted.load()) fail("", what);  // another group of this rank failed: its sockets are shut
    const int d = dead();
    if (d >= 0) {
      fail("its rank " + std::to_string(d) + " (world rank " + std::to_string(members_[static_cast<size_t>(d)]) + ") " +
               peers_[static_cast<size_t>(d)]->gone + ": it has probably failed",
           what);
    }
    pfds.clear();
    who.clear();
    for (size_t j = 0; j < peers_.size(); ++j) {
      const Peer& p = *peers_[j];
      if (p.fd < 0 || !p.gone.empty()) continue;
      pfds.push_back({p.fd, static_cast<short>(POLLIN | (p.out_off < p.out.size() ? POLLOUT : 0)), 0});
      who.push_back(j);
    }
    const int r = ::poll(pfds.data(), pfds.size(), 1000);
    if (r < 0 && errno != EINTR) fail(std::string("poll failed: ") + std::strerror(errno), what);
    if (r <= 0) {
      if (timeout_s_ > 0 && Clock::now() - start > std::chrono::seconds(timeout_s_)) {
        fail("waited more than " + std::to_string(timeout_s_) + " s: another rank has probably failed or stopped (--distributed-timeout-seconds)",
             what);
      }
      continue;
    }
    for (size_t k = 0; k < pfds.size(); ++k) {
      Peer& p = *peers_[who[k]];
      if (pfds[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        for (;;) {
          const ssize_t n = ::recv(p.fd, buf.data(), buf.size(), 0);
          if (n > 0) {
            p.in.append(buf.data(), static_cast<size_t>(n));
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (n < 0 && errno == EINTR) continue;
          p.gone = n == 0 ? "closed its connection" : std::string("lost its connection (") + std::strerror(errno) + ")";
          break;
        }
        for (;;) {  // whole frames
          uint64_t len = 0;
          if (p.in.size() - p.in_off < sizeof(len)) break;
          std::memcpy(&len, p.in.data() + p.in_off, sizeof(len));
          if (p.in.size() - p.in_off - sizeof(len) < len) break;
          p.frames.push_back(p.in.substr(p.in_off + sizeof(len), len));
          p.in_off += sizeof(len) + len;
        }
        if (p.in_off == p.in.size()) {
          p.in.clear();
          p.in_off = 0;
        } else if (p.in_off > p.in.size() / 2) {  // a peer streaming ahead: keep the buffer to what is unread
          p.in.erase(0, p.in_off);
          p.in_off = 0;
        }
      }
      if ((pfds[k].revents & POLLOUT) && p.gone.empty()) {
        while (p.out_off < p.out.size()) {
          const ssize_t n = ::send(p.fd, p.out.data() + p.out_off, p.out.size() - p.out_off, MSG_NOSIGNAL);
          if (n > 0) {
            p.out_off += static_cast<size_t>(n);
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (n < 0 && errno == EINTR) continue;
          if (p.gone.empty()) p.gone = std::string("lost its connection (") + std::strerror(errno) + ")";
          break;
        }
        if (p.out_off == p.out.size()) {
          p.out.clear();
          p.out_off = 0;
        }
      }
    }
  }
}

std::string TcpCommunicator::take(int peer, const char* what) {
  Peer& p = *peers_[static_cast<size_t>(peer)];
  progress(what, [&] { return !p.frames.empty(); }, [&] { return p.gone.empty() ? -1 : peer; });
  std::string f = std::move(p.frames.front());
  p.frames.pop_front();
  return f;
}

void TcpCommunicator::flush(const char* what) {
  progress(
      what,
      [&] {
        for (const auto& p : peers_) {
          if (p->out_off < p->out.size()) return false;
        }
        return true;
      },
      [&] {
        for (size_t j = 0; j < peers_.size(); ++j) {
          if (!peers_[j]->gone.empty() && peers_[j]->out_off < peers_[j]->out.size()) return static_cast<int>(j);
        }
        return -1;
      });
}

namespace {

template <typename T>
void copy_frame(const std::string& f, T* dst, int64_t n, const char* what) {
  if (f.size() != static_cast<size_t>(n) * sizeof(T)) {
    throw std::runtime_error(std::string(what) + ": a peer sent " + std::to_string(f.size()) + " bytes, " +
                             std::to_string(static_cast<size_t>(n) * sizeof(T)) + " expected (the ranks disagree on the sizes)");
  }
  if (n > 0) std::memcpy(dst, f.data(), f.size());
}

std::vector<int64_t> offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> o(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) o[i + 1] = o[i] + counts[i];
  return o;
}

std::vector<int64_t> even(int64_t n, int size) {
  std::vector<int64_t> c(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) c[static_cast<size_t>(i)] = n / size + (i < n % size ? 1 : 0);
  return c;
}

}  // namespace

// Member p reduces block p (send[offs[p], offs[p+1])) over all members in rank order: the same sums on
// every rank. gather_after: out is the whole array and receives every block; else out is this rank's block.
template <typename T>
void TcpCommunicator::reduce_blocks(const T* send, T* out, const std::vector<int64_t>& offs, ReduceOp op, bool gather_after,
                                    const char* what) {
  const int me = rank_, W = size();
  for (int p = 0; p < W; ++p) {
    if (p != me) post(p, send + offs[static_cast<size_t>(p)], static_cast<size_t>(offs[static_cast<size_t>(p) + 1] - offs[static_cast<size_t>(p)]) * sizeof(T));
  }
  const int64_t lo = offs[static_cast<size_t>(me)], n = offs[static_cast<size_t>(me) + 1] - lo;
  std::vector<T> acc(static_cast<size_t>(n)), part(static_cast<size_t>(n));
  for (int p = 0; p < W; ++p) {
    const T* src = send + lo;
    if (p != me) {
      copy_frame(take(p, what), part.data(), n, what);
      src = part.data();
    }
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      if (p == 0) acc[k] = src[i];
      else acc[k] = op == ReduceOp::kMax ? std::max(acc[k], src[i]) : acc[k] + src[i];
    }
  }
  if (op == ReduceOp::kAvg) {
    for (auto& v : acc) v /= static_cast<T>(W);
  }
  if (!gather_after) {
    if (n > 0) std::memcpy(out, acc.data(), static_cast<size_t>(n) * sizeof(T));
    flush(what);
    return;
  }
  for (int p = 0; p < W; ++p) {
    if (p != me) post(p, acc.data(), static_cast<size_t>(n) * sizeof(T));
  }
  if (n > 0) std::memcpy(out + lo, acc.data(), static_cast<size_t>(n) * sizeof(T));
  for (int p = 0; p < W; ++p) {
    if (p != me) copy_frame(take(p, what), out + offs[static_cast<size_t>(p)], offs[static_cast<size_t>(p) + 1] - offs[static_cast<size_t>(p)], what);
  }
  flush(what);
}

void TcpCommunicator::all_reduce(float* data, int64_t n, ReduceOp op) {
  if (size() > 1) reduce_blocks(data, data, offsets(even(n, size())), op, true, "all-reduce");
}

void TcpCommunicator::all_reduce(double* data, int64_t n, ReduceOp op) {
  if (size() > 1) reduce_blocks(data, data, offsets(even(n, size())), op, true, "all-reduce");
}

std::unique_ptr<CommRequest> TcpCommunicator::all_reduce_async(float* data, int64_t n, ReduceOp op) {
  all_reduce(data, n, op);  // completes here: TCP collectives do not overlap compute
  return std::make_unique<DoneRequest>();
}

void TcpCommunicator::reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) {
  reduce_scatter_v_async(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), n), op);
}

std::unique_ptr<CommRequest> TcpCommunicator::reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                                     ReduceOp op) {
  if (counts.size() != static_cast<size_t>(size())) throw std::logic_error("reduce_scatter_v: one count per rank expected");
  reduce_blocks(full, mine, offsets(counts), op, false, "reduce-scatter");
  return std::make_unique<DoneRequest>();
}

void TcpCommunicator::all_gather(const float* send, float* recv, int64_t n) {
  all_gather_v_async(send, recv, std::vector<int64_t>(static_cast<size_t>(size()), n));
}

std::unique_ptr<CommRequest> TcpCommunicator::all_gather_async(const float* send, float* recv, int64_t n) {
  all_gather(send, recv, n);
  return std::make_unique<DoneRequest>();
}

std::unique_ptr<CommRequest> TcpCommunicator::all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) {
  if (counts.size() != static_cast<size_t>(size())) throw std::logic_error("all_gather_v: one count per rank expected");
  const auto offs = offsets(counts);
  const size_t me = static_cast<size_t>(rank_);
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) post(p, mine, static_cast<size_t>(counts[me]) * sizeof(float));
  }
  if (full + offs[me] != mine && counts[me] > 0) std::memmove(full + offs[me], mine, static_cast<size_t>(counts[me]) * sizeof(float));
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) copy_frame(take(p, "all-gather"), full + offs[static_cast<size_t>(p)], counts[static_cast<size_t>(p)], "all-gather");
  }
  flush("all-gather");
  return std::make_unique<DoneRequest>();
}

void TcpCommunicator::all_to_all(const float* send, float* recv, int64_t n) {
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) post(p, send + p * n, static_cast<size_t>(n) * sizeof(float));
  }
  if (send != recv && n > 0) std::memmove(recv + rank_ * n, send + rank_ * n, static_cast<size_t>(n) * sizeof(float));
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) copy_frame(take(p, "all-to-all"), recv + p * n, n, "all-to-all");
  }
  flush("all-to-all");
}

void TcpCommunicator::send(const float* data, int64_t n, int peer) {
  post(peer, data, static_cast<size_t>(n) * sizeof(float));
  flush("send");  // on the wire before this rank turns to other groups
}

void TcpCommunicator::recv(float* data, int64_t n, int peer) { copy_frame(take(peer, "recv"), data, n, "recv"); }

void TcpCommunicator::broadcast(void* data, int64_t bytes, int root) {
  if (size() == 1) return;
  if (rank_ == root) {
    for (int p = 0; p < size(); ++p) {
      if (p != rank_) post(p, data, static_cast<size_t>(bytes));
    }
    flush("broadcast");
  } else {
    copy_frame(take(root, "broadcast"), static_cast<char*>(data), bytes, "broadcast");
  }
}

void TcpCommunicator::barrier() { all_gather_strings(""); }

std::vector<std::string> TcpCommunicator::all_gather_strings(const std::string& mine) {
  std::vector<std::string> all(static_cast<size_t>(size()));
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) post(p, mine.data(), mine.size());
  }
  all[static_cast<size_t>(rank_)] = mine;
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) all[static_cast<size_t>(p)] = take(p, "all-gather");
  }
  flush("all-gather");
  return all;
}

std::shared_ptr<Communicator> TcpCommunicator::sub_group(int color, int key, const std::string& name) { return split(color, key, name); }

std::shared_ptr<TcpCommunicator> TcpCommunicator::split(int color, int key, const std::string& name, int64_t timeout_seconds) {
  const auto all = all_gather_strings(std::to_string(color) + " " + std::to_string(key));
  const int64_t seq = splits_++;
  if (color < 0) return nullptr;
  std::vector<std::pair<std::pair<int64_t, int>, int>> mem;  // ((key, parent rank), parent rank)
  for (int p = 0; p < size(); ++p) {
    std::istringstream in(all[static_cast<size_t>(p)]);
    int64_t c = 0, k = 0;
    in >> c >> k;
    if (c == color) mem.push_back({{k, p}, p});
  }
  std::sort(mem.begin(), mem.end());
  std::vector<int64_t> world;
  int me = 0;
  for (const auto& m : mem) {
    if (m.second == rank_) me = static_cast<int>(world.size());
    world.push_back(members_[static_cast<size_t>(m.second)]);
  }
  const std::string uid = uid_ + "/" + std::to_string(seq) + "." + std::to_string(color);
  auto fds = connect_group(*node_, uid, world, me);
  return std::make_shared<TcpCommunicator>(node_, uid, name, world, me, std::move(fds), timeout_seconds < 0 ? timeout_s_ : timeout_seconds);
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
  const std::string fix = " (MASTER_ADDR / MASTER_PORT; MEGATRAIN_RENDEZVOUS_PORT picks another port)";
  int my_port = 0;
  node->listen_fd = listen_on(0, &my_port);
  if (node->listen_fd < 0) throw std::runtime_error(std::string("cannot listen on a TCP port: ") + std::strerror(errno));
  const size_t W = static_cast<size_t>(launch.world_size);
  node->hosts.assign(W, "");
  node->ports.assign(W, 0);
  std::string table;
  if (launch.rank == 0) {
    node->hosts[0] = launch.master_addr;
    node->ports[0] = my_port;
    const int srv = W > 1 ? listen_on(port, nullptr) : -2;
    if (srv == -1) throw std::runtime_error("rank 0 cannot listen at " + where + ": " + std::strerror(errno) + fix);
    std::vector<int> conns;
    try {
      while (conns.size() + 1 < W) {
        pollfd pfd{srv, POLLIN, 0};
        const int r = ::poll(&pfd, 1, static_cast<int>(ms_left(deadline)));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          throw std::runtime_error("only " + std::to_string(conns.size()) + " of " + std::to_string(W - 1) + " ranks reached " + where +
                                   " in " + std::to_string(node->setup_timeout_s) + " s" + fix);
        }
        const int c = ::accept(srv, nullptr, nullptr);
        if (c < 0) continue;
        std::string hello;
        long long r_peer = -1, p_peer = 0;
        char magic[32] = {0};
        if (!recv_str(c, hello, deadline, 4096) || std::sscanf(hello.c_str(), "%31s %lld %lld", magic, &r_peer, &p_peer) != 3 ||
            std::string(magic) != kMagic || r_peer <= 0 || r_peer >= static_cast<long long>(W) || node->ports[static_cast<size_t>(r_peer)] != 0) {
          ::close(c);  // a stray client, or a rank twice
          continue;
        }
        node->hosts[static_cast<size_t>(r_peer)] = peer_ip(c);
        node->ports[static_cast<size_t>(r_peer)] = static_cast<int>(p_peer);
        conns.push_back(c);
      }
      for (size_t r = 0; r < W; ++r) table += node->hosts[r] + " " + std::to_string(node->ports[r]) + "\n";
      for (int c : conns) send_str(c, std::string(kMagic) + "\n" + table);
    } catch (...) {
      for (int c : conns) ::close(c);
      if (srv >= 0) ::close(srv);
      throw;
    }
    for (int c : conns) ::close(c);
    if (srv >= 0) ::close(srv);
  } else {
    const int fd = connect_to(launch.master_addr, port, deadline);
    if (fd < 0) {
      throw std::runtime_error("rank " + std::to_string(launch.rank) + " could not reach " + where + " in " + std::to_string(node->setup_timeout_s) +
                               " s: is rank 0 running?" + fix);
    }
    std::string got;
    bool ok = true;
    try {
      send_str(fd, std::string(kMagic) + " " + std::to_string(launch.rank) + " " + std::to_string(my_port));
      ok = recv_str(fd, got, deadline);
    } catch (const std::exception&) {
      ok = false;
    }
    ::close(fd);
    if (!ok || got.rfind(std::string(kMagic) + "\n", 0) != 0) {
      throw std::runtime_error(where + " did not answer as megatrain's rank 0 (another service on that port, such as torchrun's agent store, "
                               "or rank 0 failed)" + fix);
    }
    std::istringstream in(got.substr(std::strlen(kMagic) + 1));
    for (size_t r = 0; r < W; ++r) in >> node->hosts[r] >> node->ports[r];
    if (!in) throw std::runtime_error(where + " sent a malformed address table (mixed megatrain versions?)");
  }
  std::vector<int64_t> members(W);
  for (size_t r = 0; r < W; ++r) members[r] = static_cast<int64_t>(r);
  auto fds = connect_group(*node, "w", members, static_cast<int>(launch.rank));
  return std::make_shared<TcpCommunicator>(node, "w", "world", members, static_cast<int>(launch.rank), std::move(fds),
                                           op_timeout_seconds < 0 ? timeout_seconds : op_timeout_seconds);
}

ProcessGroups make_tcp_process_groups(const std::shared_ptr<TcpCommunicator>& world, const RankLayout& layout, int64_t r) {
  auto checkpoint = world->split(0, static_cast<int>(r), "checkpoint", 0);  // no timeout: a save's waits are long by nature
  ProcessGroups g = split_layout_groups(layout, r, [&](int color, int key, const std::string& name) { return world->split(color, key, name); });
  g.world = world;
  g.checkpoint = checkpoint;
  return g;
}

}  // namespace mt
