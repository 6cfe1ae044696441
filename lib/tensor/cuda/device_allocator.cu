// device_allocator.cu: size classes, free lists, cudaMalloc on a miss (retrying once after freeing the
// cache when the device is full).
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt {

DeviceAllocator& DeviceAllocator::instance() {
  static DeviceAllocator* a = new DeviceAllocator();  // outlives static destructors that may free tensors
  return *a;
}

size_t DeviceAllocator::size_class(size_t bytes) {
  if (bytes <= 512) return 512;
  if (bytes <= (1u << 20)) {  // small: powers of two
    size_t c = 512;
    while (c < bytes) c <<= 1;
    return c;
  }
  const size_t step = 2u << 20;  // large: 2 MiB granularity
  return (bytes + step - 1) / step * step;
}

void* device_malloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const auto mib = [](size_t b) { return std::to_string(b >> 20); };
    throw std::runtime_error("out of GPU memory allocating " + mib(bytes) + " MiB for " + what + " (" + mib(free_b) + " of " + mib(total_b) +
                             " MiB free): lower --micro-batch-size, use --recompute-granularity full --recompute-method uniform, "
                             "--use-distributed-optimizer or more --tensor-model-parallel-size (`megatrain plan` estimates the memory per GPU)");
  }
  MT_CUDA_CHECK(e);
  DeviceAllocator::instance().add_long_lived(p, bytes);
  return p;
}

void device_free(void* p) {
  if (!p) return;
  DeviceAllocator::instance().remove_long_lived(p);
  cudaFree(p);
}

void DeviceAllocator::update_peaks_locked() {
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.long_lived_bytes + stats_.in_use_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.long_lived_bytes + stats_.in_use_bytes + stats_.cached_bytes);
}

void DeviceAllocator::add_long_lived(void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  long_lived_[p] = bytes;
  stats_.long_lived_bytes += bytes;
  update_peaks_locked();
}

void DeviceAllocator::remove_long_lived(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = long_lived_.find(p);
  if (it == long_lived_.end()) throw std::logic_error("device_free of a pointer device_malloc did not allocate");
  stats_.long_lived_bytes -= it->second;
  long_lived_.erase(it);
}

void* DeviceAllocator::allocate(size_t bytes) {
  const size_t c = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.requests;
  void* p = nullptr;
  auto it = free_.find(c);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= c;
  } else {
    cudaError_t e = cudaMalloc(&p, c);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      free_cached_locked();
      e = cudaMalloc(&p, c);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("out of GPU memory allocating " + std::to_string(c >> 20) + " MiB (" +
                               std::to_string(stats_.in_use_bytes >> 20) + " MiB in use): lower --micro-batch-size or use "
                               "recompute / more parallelism (megatrain plan estimates the memory)");
    }
    ++stats_.device_mallocs;
  }
  live_[p] = c;
  stats_.in_use_bytes += c;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  update_peaks_locked();
  return p;
}

void DeviceAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) throw std::logic_error("DeviceAllocator::release of a pointer it did not allocate");
  const size_t c = it->second;
  live_.erase(it);
  stats_.in_use_bytes -= c;
  stats_.cached_bytes += c;
  free_[c].push_back(p);
}

void DeviceAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  free_cached_locked();
}

void DeviceAllocator::free_cached_locked() {
  for (auto& [sz, blocks] : free_) {
    for (void* b : blocks) {
      MT_CUDA_CHECK(cudaFree(b));
      ++stats_.device_frees;
    }
    blocks.clear();
  }
  stats_.cached_bytes = 0;
}

AllocatorStats DeviceAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats out = stats_;
  out.live_allocations = static_cast<int64_t>(live_.size() + long_lived_.size());
  return out;
}

}  // namespace mt
