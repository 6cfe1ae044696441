// device_allocator.h: the caching device allocator. Blocks are rounded up to size classes and kept
// on per-class free lists when released, so a training step's allocations are served from the cache
// after the first step: no cudaMalloc / cudaFree in the steady state (cudaMalloc only, never managed
// memory). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mt {

struct AllocatorStats {
  size_t in_use_bytes = 0, cached_bytes = 0, peak_in_use_bytes = 0;
  int64_t device_mallocs = 0, device_frees = 0, requests = 0;
  // The long-lived buffers of device_malloc, and the peaks of everything allocated (long-lived + in use) and
  // reserved (long-lived + in use + cached): Megatron's "allocated" and "reserved" memory.
  size_t long_lived_bytes = 0, peak_allocated_bytes = 0, peak_reserved_bytes = 0;
  int64_t live_allocations = 0;  // buffers of either kind not yet freed
};

// cudaMalloc for a long-lived buffer (weights, optimizer state, activations): out of memory becomes a
// message naming what was being allocated, the GPU's free and total memory, and what to change.
void* device_malloc(size_t bytes, const char* what);
// Frees a device_malloc buffer (nullptr: nothing).
void device_free(void* p);

class DeviceAllocator {
 public:
  static DeviceAllocator& instance();
  void* allocate(size_t bytes);
  void release(void* p);
  // Returns the cached blocks to the driver (e.g. before a large one-off allocation).
  void empty_cache();
  AllocatorStats stats();
  static size_t size_class(size_t bytes);
  // device_malloc's and device_free's accounting.
  void add_long_lived(void* p, size_t bytes);
  void remove_long_lived(void* p);

 private:
  DeviceAllocator() = default;
  void free_cached_locked();  // mu_ held
  void update_peaks_locked();
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;     // size class -> cached blocks
  std::unordered_map<void*, size_t> live_;        // block -> size class
  std::unordered_map<void*, size_t> long_lived_;  // device_malloc's buffers -> bytes
  AllocatorStats stats_;
};

}  // namespace mt
