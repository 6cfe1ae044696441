// communicator.h: the one collective interface layers and the trainer call (shared/DESIGN.md). With a
// group of one rank every call is a no-op, so single-process code runs the same path as parallel code.
// MPI (host buffers) and NCCL (device buffers) implementations plug in behind it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace mt {

enum class ReduceOp { kSum, kAvg, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce(float* data, int64_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, int64_t n, ReduceOp op) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
};

// A group of one: this process alone.
class SelfCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce(float*, int64_t, ReduceOp) override {}
  void all_reduce(double*, int64_t, ReduceOp) override {}
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
};

// The groups one rank takes part in (from the rank layout).
struct ProcessGroups {
  std::shared_ptr<Communicator> world, tp, dp, pp, dp_cp;
  static ProcessGroups single() {
    auto self = std::make_shared<SelfCommunicator>();
    return ProcessGroups{self, self, self, self, self};
  }
};

}  // namespace mt
