// fake_groups.h: groups of several ranks played by one process in the unit tests. NoCollectives is such a group
// seen from one rank, for a model's coordinates only: every collective throws (nothing may be communicated over
// it); a test that needs one collective derives from it and overrides that one.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt::test {

class NoCollectives : public Communicator {
 public:
  NoCollectives(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float*, int64_t, ReduceOp) override { fail(); }
  void all_reduce(double*, int64_t, ReduceOp) override { fail(); }
  std::unique_ptr<CommRequest> all_reduce_async(float*, int64_t, ReduceOp) override { fail(); }
  void reduce_scatter(const float*, float*, int64_t, ReduceOp) override { fail(); }
  std::unique_ptr<CommRequest> reduce_scatter_v_async(const float*, float*, const std::vector<int64_t>&, ReduceOp) override { fail(); }
  std::unique_ptr<CommRequest> all_gather_v_async(const float*, float*, const std::vector<int64_t>&) override { fail(); }
  void all_gather(const float*, float*, int64_t) override { fail(); }
  std::unique_ptr<CommRequest> all_gather_async(const float*, float*, int64_t) override { fail(); }
  void all_to_all(const float*, float*, int64_t) override { fail(); }
  void all_to_all_v(const float*, const std::vector<int64_t>&, float*, const std::vector<int64_t>&) override { fail(); }
  void send(const float*, int64_t, int) override { fail(); }
  void recv(float*, int64_t, int) override { fail(); }
  std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>&) override { fail(); }
  void broadcast(void*, int64_t, int) override { fail(); }
  void barrier() override { fail(); }
  std::vector<std::string> all_gather_strings(const std::string&) override { fail(); }
  std::shared_ptr<Communicator> sub_group(int, int, const std::string&) override { fail(); }

 protected:
  [[noreturn]] static void fail() { throw std::logic_error("a unit test's fake group: no such collective here"); }

 private:
  int rank_, size_;
};

}  // namespace mt::test
