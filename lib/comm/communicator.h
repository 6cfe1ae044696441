// communicator.h: the one collective interface layers and the trainer call (shared/DESIGN.md). With a
// group of one rank every call is a copy or a no-op, so single-process code runs the same path as
// parallel code. MPI (host buffers, lib/comm/mpi_communicator) and NCCL (device buffers) plug in here.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt {

enum class ReduceOp { kSum, kAvg, kMax };

// A non-blocking collective in flight; wait() completes it (idempotent).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

// One transfer of a point-to-point batch, with a peer given by its rank in the group.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  float* data = nullptr;  // a send only reads it
  int64_t n = 0;
  int peer = 0;
  static P2POp send(const float* data, int64_t n, int peer) { return {Kind::kSend, const_cast<float*>(data), n, peer}; }
  static P2POp recv(float* data, int64_t n, int peer) { return {Kind::kRecv, data, n, peer}; }
};

// Element offsets of counts laid out back to back ([0, c0, c0 + c1, ...], one more than counts).
std::vector<int64_t> count_offsets(const std::vector<int64_t>& counts);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce(float* data, int64_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, int64_t n, ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n, ReduceOp op) = 0;
  // recv[n] = reduce over ranks of send[rank * n .. rank * n + n).
  virtual void reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) = 0;
  // Uneven blocks: counts[r] elements for rank r, laid out back to back in the full buffer.
  virtual std::unique_ptr<CommRequest> reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                              ReduceOp op) = 0;
  virtual std::unique_ptr<CommRequest> all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) = 0;
  // recv[r * n .. r * n + n) = send of rank r.
  virtual void all_gather(const float* send, float* recv, int64_t n) = 0;
  virtual std::unique_ptr<CommRequest> all_gather_async(const float* send, float* recv, int64_t n) = 0;
  // recv[r * n ..) = send[rank's block for me] of rank r; blocks of n elements.
  virtual void all_to_all(const float* send, float* recv, int64_t n) = 0;
  // recv_counts[r] elements from rank r into recv, back to back in rank order, and send_counts[r] elements of
  // send (back to back in rank order) to rank r, as MPI_Alltoallv: what rank r sends this rank must be what
  // this rank expects from it. send and recv must not overlap.
  virtual void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                            const std::vector<int64_t>& recv_counts) = 0;
  virtual void send(const float* data, int64_t n, int peer) = 0;
  virtual void recv(float* data, int64_t n, int peer) = 0;
  // Every transfer of the batch posted at once (Megatron's batch_isend_irecv: neighbours that send to each
  // other do not wait on each other); wait() completes them all. Sends' buffers stay untouched, and
  // receives' unread, until then. Between two ranks the transfers in one direction meet in posting order.
  virtual std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>& ops) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Every rank's string, in rank order (checkpoint metadata).
  virtual std::vector<std::string> all_gather_strings(const std::string& mine) = 0;
  // The ranks of this group with the same color, ordered by key (collective: every rank calls it).
  virtual std::shared_ptr<Communicator> sub_group(int color, int key, const std::string& name) = 0;
};

class DoneRequest final : public CommRequest {
 public:
  void wait() override {}
};

// A group of one: this process alone.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  std::unique_ptr<CommRequest> all_reduce_async(float*, int64_t, ReduceOp) override { return std::make_unique<DoneRequest>(); }
  void reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp) override { copy(send, recv, n); }
  void all_gather(const float* send, float* recv, int64_t n) override { copy(send, recv, n); }
  std::unique_ptr<CommRequest> all_gather_async(const float* send, float* recv, int64_t n) override {
    copy(send, recv, n);
    return std::make_unique<DoneRequest>();
  }
  void all_to_all(const float* send, float* recv, int64_t n) override { copy(send, recv, n); }
  std::unique_ptr<CommRequest> reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                      ReduceOp) override {
    copy(full, mine, counts.at(0));
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) override {
    copy(mine, full, counts.at(0));
    return std::make_unique<DoneRequest>();
  }
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts) override {
    if (send_counts.at(0) != recv_counts.at(0)) throw std::logic_error("all_to_all_v: a group of one sends itself what it receives");
    copy(send, recv, send_counts[0]);
  }
  void send(const float*, int64_t, int) override { throw std::logic_error("send in a group of one: there is no peer"); }
  void recv(float*, int64_t, int) override { throw std::logic_error("recv in a group of one: there is no peer"); }
  // Transfers to itself: each receive takes the next send's data.
  std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>& ops) override;
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  std::vector<std::string> all_gather_strings(const std::string& mine) override { return {mine}; }
  std::shared_ptr<Communicator> sub_group(int, int, const std::string&) override { return std::make_shared<SelfCommunicator>(); }

 private:
  static void copy(const float* s, float* d, int64_t n) {
    if (s != d) std::memmove(d, s, static_cast<size_t>(n) * sizeof(float));
  }
};

// The groups one rank takes part in (from the rank layout).
struct ProcessGroups {
  std::shared_ptr<Communicator> world, tp, dp, pp, cp, dp_cp, embedding;
  // The expert grid's groups (expert-TP x EP x expert-DP x PP, Megatron's expert RankGenerator): the
  // expert-parallel group (token dispatch), the experts' tensor-parallel group, and the group their
  // gradients are reduced over.
  std::shared_ptr<Communicator> ep, expert_tp, expert_dp;
  // A duplicate of world for checkpoint I/O, so a background save's collectives never interleave with
  // training's.
  std::shared_ptr<Communicator> checkpoint;
  static ProcessGroups single() {
    auto self = std::make_shared<SelfCommunicator>();
    return ProcessGroups{self, self, self, self, self, self, self, self, self, self, self};
  }
};

}  // namespace mt
