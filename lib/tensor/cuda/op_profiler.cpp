// op_profiler.cpp
#include "tensor/cuda/op_profiler.h"

#include <algorithm>
#include <map>

#include "tensor/cuda/cuda_check.h"

namespace mt {

OpProfiler& OpProfiler::instance() {
  static OpProfiler p;
  return p;
}

void OpProfiler::enable(cudaStream_t stream) {
  on_ = true;
  stream_ = stream;
  marks_.clear();
}

void OpProfiler::begin(const char* name) {
  Mark m{name, nullptr, nullptr};
  MT_CUDA_CHECK(cudaEventCreate(&m.start));
  MT_CUDA_CHECK(cudaEventCreate(&m.stop));
  MT_CUDA_CHECK(cudaEventRecord(m.start, stream_));
  marks_.push_back(m);
}

void OpProfiler::end() { MT_CUDA_CHECK(cudaEventRecord(marks_.back().stop, stream_)); }

std::vector<std::pair<std::string, double>> OpProfiler::collect() {
  on_ = false;
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::map<std::string, double> total;
  for (auto& m : marks_) {
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.stop));
    total[m.name] += ms;
    cudaEventDestroy(m.start);
    cudaEventDestroy(m.stop);
  }
  marks_.clear();
  std::vector<std::pair<std::string, double>> out(total.begin(), total.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace mt
