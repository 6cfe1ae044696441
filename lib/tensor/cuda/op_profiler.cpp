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
  open_.clear();
  if (!origin_) MT_CUDA_CHECK(cudaEventCreate(&origin_));
  MT_CUDA_CHECK(cudaEventRecord(origin_, stream_));
}

void OpProfiler::begin(const char* name, cudaStream_t stream) {
  Mark m{name, stream ? stream : stream_, nullptr, nullptr};
  MT_CUDA_CHECK(cudaEventCreate(&m.start));
  MT_CUDA_CHECK(cudaEventCreate(&m.stop));
  MT_CUDA_CHECK(cudaEventRecord(m.start, m.stream));
  open_.push_back(marks_.size());
  marks_.push_back(m);
}

void OpProfiler::end() {
  const Mark& m = marks_[open_.back()];
  open_.pop_back();
  MT_CUDA_CHECK(cudaEventRecord(m.stop, m.stream));
}

std::vector<std::pair<std::string, double>> OpProfiler::collect() {
  on_ = false;
  MT_CUDA_CHECK(cudaDeviceSynchronize());  // every stream a region was recorded on
  std::map<std::string, double> total;
  std::vector<cudaStream_t> streams{stream_};
  timeline_.clear();
  for (auto& m : marks_) {
    float ms = 0, t0 = 0, t1 = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.stop));
    MT_CUDA_CHECK(cudaEventElapsedTime(&t0, origin_, m.start));
    MT_CUDA_CHECK(cudaEventElapsedTime(&t1, origin_, m.stop));
    total[m.name] += ms;
    auto it = std::find(streams.begin(), streams.end(), m.stream);
    if (it == streams.end()) it = streams.insert(streams.end(), m.stream);
    timeline_.push_back({m.name, static_cast<int>(it - streams.begin()), t0, t1});
    cudaEventDestroy(m.start);
    cudaEventDestroy(m.stop);
  }
  marks_.clear();
  std::vector<std::pair<std::string, double>> out(total.begin(), total.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace mt
