// tcp_communicator.cpp: the TCP world's collectives (see tcp_communicator.h; set-up in tcp_connect.cpp).
#include "comm/tcp_communicator.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "comm/tcp_connect.h"

namespace mt {

using Clock = TcpClock;

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
  std::vector<char>& buf = recv_buf_;
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

std::vector<int64_t> even(int64_t n, int size) {
  std::vector<int64_t> c(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) c[static_cast<size_t>(i)] = n / size + (i < n % size ? 1 : 0);
  return c;
}

}  // namespace

void TcpCommunicator::exchange(const std::function<std::string_view(int)>& block, const std::function<void(int, std::string&&)>& got,
                               const char* what) {
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    const std::string_view b = block(p);
    post(p, b.data(), b.size());
  }
  for (int p = 0; p < size(); ++p) {
    if (p != rank_) got(p, take(p, what));
  }
  flush(what);
}

// Member p reduces block p (send[offs[p], offs[p+1])) over all members in rank order: the same sums on
// every rank. gather_after: out is the whole array and receives every block; else out is this rank's block.
template <typename T>
void TcpCommunicator::reduce_blocks(const T* send, T* out, const std::vector<int64_t>& offs, ReduceOp op, bool gather_after,
                                    const char* what) {
  const auto bytes = [&](const T* p, int64_t n) { return std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n) * sizeof(T)); };
  const auto count = [&](int p) { return offs[static_cast<size_t>(p) + 1] - offs[static_cast<size_t>(p)]; };
  const int me = rank_;
  const int64_t lo = offs[static_cast<size_t>(me)], n = count(me);
  std::vector<std::vector<T>> parts(static_cast<size_t>(size()));
  exchange([&](int p) { return bytes(send + offs[static_cast<size_t>(p)], count(p)); },
           [&](int p, std::string&& f) {
             parts[static_cast<size_t>(p)].resize(static_cast<size_t>(n));
             copy_frame(f, parts[static_cast<size_t>(p)].data(), n, what);
           },
           what);
  std::vector<T> acc(static_cast<size_t>(n));
  for (int p = 0; p < size(); ++p) {
    const T* src = p == me ? send + lo : parts[static_cast<size_t>(p)].data();
    for (int64_t i = 0; i < n; ++i) {
      const size_t k = static_cast<size_t>(i);
      if (p == 0) acc[k] = src[i];
      else acc[k] = op == ReduceOp::kMax ? std::max(acc[k], src[i]) : acc[k] + src[i];
    }
  }
  if (op == ReduceOp::kAvg) {
    for (auto& v : acc) v /= static_cast<T>(size());
  }
  if (n > 0) std::memcpy(gather_after ? out + lo : out, acc.data(), static_cast<size_t>(n) * sizeof(T));
  if (!gather_after) return;
  exchange([&](int) { return bytes(acc.data(), n); },
           [&](int p, std::string&& f) { copy_frame(f, out + offs[static_cast<size_t>(p)], count(p), what); }, what);
}

void TcpCommunicator::all_reduce(float* data, int64_t n, ReduceOp op) {
  if (size() > 1) reduce_blocks(data, data, count_offsets(even(n, size())), op, true, "all-reduce");
}

void TcpCommunicator::all_reduce(double* data, int64_t n, ReduceOp op) {
  if (size() > 1) reduce_blocks(data, data, count_offsets(even(n, size())), op, true, "all-reduce");
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
  reduce_blocks(full, mine, count_offsets(counts), op, false, "reduce-scatter");
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
  const auto offs = count_offsets(counts);
  const size_t me = static_cast<size_t>(rank_);
  const std::string_view block(reinterpret_cast<const char*>(mine), static_cast<size_t>(counts[me]) * sizeof(float));
  exchange([&](int) { return block; },
           [&](int p, std::string&& f) { copy_frame(f, full + offs[static_cast<size_t>(p)], counts[static_cast<size_t>(p)], "all-gather"); },
           "all-gather");  // posts copy `mine` before any block lands
  if (full + offs[me] != mine && counts[me] > 0) std::memmove(full + offs[me], mine, block.size());
  return std::make_unique<DoneRequest>();
}

void TcpCommunicator::all_to_all(const float* send, float* recv, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (send != recv && n > 0) std::memmove(recv + rank_ * n, send + rank_ * n, bytes);
  exchange([&](int p) { return std::string_view(reinterpret_cast<const char*>(send + p * n), bytes); },
           [&](int p, std::string&& f) { copy_frame(f, recv + p * n, n, "all-to-all"); }, "all-to-all");
}

void TcpCommunicator::all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                   const std::vector<int64_t>& recv_counts) {
  if (send_counts.size() != static_cast<size_t>(size()) || recv_counts.size() != static_cast<size_t>(size())) {
    throw std::logic_error("all_to_all_v: one count per rank expected");
  }
  const auto so = count_offsets(send_counts), ro = count_offsets(recv_counts);
  const auto me = static_cast<size_t>(rank_);
  if (send_counts[me] != recv_counts[me]) throw std::logic_error("all_to_all_v: this rank's block to itself differs in size from what it expects");
  if (send_counts[me] > 0) std::memmove(recv + ro[me], send + so[me], static_cast<size_t>(send_counts[me]) * sizeof(float));
  exchange(
      [&](int p) {
        const auto q = static_cast<size_t>(p);
        return std::string_view(reinterpret_cast<const char*>(send + so[q]), static_cast<size_t>(send_counts[q]) * sizeof(float));
      },
      [&](int p, std::string&& f) { copy_frame(f, recv + ro[static_cast<size_t>(p)], recv_counts[static_cast<size_t>(p)], "all-to-all"); },
      "all-to-all");
}

std::unique_ptr<CommRequest> TcpCommunicator::send_recv_batch_async(const std::vector<P2POp>& ops) {
  std::deque<const P2POp*> to_self;
  for (const P2POp& op : ops) {
    if (op.peer < 0 || op.peer >= size()) throw std::logic_error("send_recv_batch: peer " + std::to_string(op.peer) + " is not in the " + name_ + " group");
    if (op.kind != P2POp::Kind::kSend) continue;
    if (op.peer == rank_) to_self.push_back(&op);
    else post(op.peer, op.data, static_cast<size_t>(op.n) * sizeof(float));
  }
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::kRecv) continue;
    if (op.peer != rank_) {
      copy_frame(take(op.peer, "send/receive batch"), op.data, op.n, "send/receive batch");
      continue;
    }
    if (to_self.empty() || to_self.front()->n != op.n) throw std::logic_error("send_recv_batch: a receive from itself without a send of its size");
    if (op.n > 0) std::memmove(op.data, to_self.front()->data, static_cast<size_t>(op.n) * sizeof(float));
    to_self.pop_front();
  }
  flush("send/receive batch");
  return std::make_unique<DoneRequest>();
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
  all[static_cast<size_t>(rank_)] = mine;
  exchange([&](int) { return std::string_view(mine); }, [&](int p, std::string&& f) { all[static_cast<size_t>(p)] = std::move(f); },
           "all-gather");
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


ProcessGroups make_tcp_process_groups(const std::shared_ptr<TcpCommunicator>& world, const RankLayout& layout, int64_t r) {
  auto checkpoint = world->split(0, static_cast<int>(r), "checkpoint", 0);  // no timeout: a save's waits are long by nature
  ProcessGroups g = split_layout_groups(layout, r, [&](int color, int key, const std::string& name) { return world->split(color, key, name); });
  g.world = world;
  g.checkpoint = checkpoint;
  return g;
}

}  // namespace mt
