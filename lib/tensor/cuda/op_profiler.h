// op_profiler.h (CUDA): where a training step's device time goes. When enabled (one chosen iteration,
// MEGATRAIN_PROFILE_ITER=N), each named region records a pair of CUDA events on the stream; collect()
// synchronises once and sums the elapsed times per name. Disabled, a region costs one branch.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace mt {

class OpProfiler {
 public:
  static OpProfiler& instance();
  void enable(cudaStream_t stream);
  bool on() const { return on_; }
  void begin(const char* name);
  void end();
  // Disables, synchronises and returns (name, total ms) sorted by time, largest first.
  std::vector<std::pair<std::string, double>> collect();

 private:
  struct Mark {
    std::string name;
    cudaEvent_t start, stop;
  };
  bool on_ = false;
  cudaStream_t stream_ = nullptr;
  std::vector<Mark> marks_;
};

struct ProfScope {
  explicit ProfScope(const char* name) : on(OpProfiler::instance().on()) {
    if (on) OpProfiler::instance().begin(name);
  }
  ~ProfScope() {
    if (on) OpProfiler::instance().end();
  }
  ProfScope(const ProfScope&) = delete;
  ProfScope& operator=(const ProfScope&) = delete;
  bool on;
};

}  // namespace mt

#define MT_PROF(name, ...)          \
  do {                              \
    const ::mt::ProfScope ps_(name); \
    __VA_ARGS__;                    \
  } while (0)
