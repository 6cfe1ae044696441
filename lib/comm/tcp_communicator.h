// tcp_communicator.h: Communicator over TCP for host buffers, for torchrun-style launches that have no
// MPI (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Every rank listens on a port of its own; rank 0's
// bootstrap at the rendezvous address hands every rank the table of those ports, and each group (the
// world, its splits, the checkpoint duplicate) then has a connection of its own to each other member, so
// collectives of different groups (a background save beside training) never share a socket.
// Collectives are direct exchanges between the members (each rank reduces its own block in rank order,
// then the blocks are gathered), all sockets progressing together so no pair of ranks waits on the
// other's send. A peer that closes its connection or a wait longer than the timeout is an error naming
// the group, the operation and the rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "parallel/launcher.h"
#include "parallel/rank_layout.h"

namespace mt {

struct TcpNode;  // this process's listener and the world's address table (shared by its groups)

class TcpCommunicator final : public Communicator {
 public:
  struct Peer;
  // members: the world ranks of the group in group order; fds: a connected socket per member (-1 for self).
  TcpCommunicator(std::shared_ptr<TcpNode> node, std::string uid, std::string name, std::vector<int64_t> members, int rank,
                  std::vector<int> fds, int64_t timeout_seconds);
  ~TcpCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void all_reduce(float* data, int64_t n, ReduceOp op) override;
  void all_reduce(double* data, int64_t n, ReduceOp op) override;
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) override;
  void all_gather(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> all_gather_async(const float* send, float* recv, int64_t n) override;
  void all_to_all(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                      ReduceOp op) override;
  std::unique_ptr<CommRequest> all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) override;
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts) override;
  void send(const float* data, int64_t n, int peer) override;
  void recv(float* data, int64_t n, int peer) override;
  // Completes when made (every send posted, then the receives taken while the sends drain).
  std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>& ops) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;
  std::vector<std::string> all_gather_strings(const std::string& mine) override;
  // color < 0: not a member (returns nullptr, like MPI_UNDEFINED). timeout_seconds < 0 keeps this group's.
  std::shared_ptr<Communicator> sub_group(int color, int key, const std::string& name) override;
  std::shared_ptr<TcpCommunicator> split(int color, int key, const std::string& name, int64_t timeout_seconds = -1);

 private:
  template <typename T>
  void reduce_blocks(const T* send, T* out, const std::vector<int64_t>& offs, ReduceOp op, bool gather_after, const char* what);
  // Sends block(p) to every other member p, then hands each one's block to got(p, bytes), in rank order.
  void exchange(const std::function<std::string_view(int)>& block, const std::function<void(int, std::string&&)>& got, const char* what);
  void post(int peer, const void* data, size_t bytes);
  std::string take(int peer, const char* what);
  void flush(const char* what);
  // Moves bytes on every connection until done(); dead(): a closed peer that done() waits for (or -1).
  void progress(const char* what, const std::function<bool()>& done, const std::function<int()>& dead);
  [[noreturn]] void fail(const std::string& why, const char* what) const;

  std::shared_ptr<TcpNode> node_;
  std::string uid_, name_;
  std::vector<int64_t> members_;
  int rank_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<char> recv_buf_ = std::vector<char>(1 << 16);  // progress()'s receive buffer
  int64_t timeout_s_ = 0;  // 0: wait as long as it takes (a dead peer still ends the wait)
  int64_t splits_ = 0;     // how many groups were split from this one (part of their uid)
};

// The port rank 0's bootstrap listens on: MEGATRAIN_RENDEZVOUS_PORT if set; under torchrun's static
// rendezvous (TORCHELASTIC_USE_AGENT_STORE=True: the agent's TCPStore holds MASTER_PORT) MASTER_PORT + 1;
// else MASTER_PORT.
int rendezvous_port(const LaunchInfo& launch, const EnvLookup& env = process_env());

// Every rank of a torchrun-style launch calls this once: the world group, connected. timeout_seconds bounds
// the set-up and, unless op_timeout_seconds >= 0 (0: none), each collective's wait.
std::shared_ptr<TcpCommunicator> make_tcp_world(const LaunchInfo& launch, int port, int64_t timeout_seconds, int64_t op_timeout_seconds = -1);

// Every group of `layout` this rank belongs to, split from world; checkpoint: a duplicate without timeout.
ProcessGroups make_tcp_process_groups(const std::shared_ptr<TcpCommunicator>& world, const RankLayout& layout, int64_t world_rank);

}  // namespace mt
