// op_profiler.h (CUDA): where a training step's device time goes. When enabled (one chosen iteration,
// MEGATRAIN_PROFILE_ITER=N), each named region records a pair of CUDA events on its stream (the training
// stream unless named: MT_PROF_ON); collect() synchronises once and sums the elapsed times per name, and keeps
// each region's start and end relative to the enable point (a timeline across streams, to see what overlaps).
// Disabled, a region costs one branch.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace mt {

class OpProfiler {
 public:
  struct Span {
    std::string name;
    int stream;  // 0: the training stream, 1, 2, ...: other streams in order of first use
    double start_ms, end_ms;
  };
  static OpProfiler& instance();
  void enable(cudaStream_t stream);
  bool on() const { return on_; }
  void begin(const char* name, cudaStream_t stream = nullptr);  // nullptr: the training stream
  void end();
  // Disables, synchronises and returns (name, total ms) sorted by time, largest first.
  std::vector<std::pair<std::string, double>> collect();
  // The regions of the last collect(), in the order they were queued.
  const std::vector<Span>& timeline() const { return timeline_; }

 private:
  struct Mark {
    std::string name;
    cudaStream_t stream;
    cudaEvent_t start, stop;
  };
  bool on_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t origin_ = nullptr;
  std::vector<Mark> marks_;
  std::vector<size_t> open_;  // regions begun and not ended (nesting)
  std::vector<Span> timeline_;
};

struct ProfScope {
  explicit ProfScope(const char* name, cudaStream_t stream = nullptr) : on(OpProfiler::instance().on()) {
    if (on) OpProfiler::instance().begin(name, stream);
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

// A region on another stream than the training stream's.
#define MT_PROF_ON(stream, name, ...)        \
  do {                                       \
    const ::mt::ProfScope ps_(name, stream); \
    __VA_ARGS__;                             \
  } while (0)
