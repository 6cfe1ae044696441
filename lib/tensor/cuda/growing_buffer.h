// growing_buffer.h: a device buffer from the caching allocator whose size follows the data, for what a step cannot size
// in advance (the rows an expert-parallel rank receives: dropless routing decides them). It grows with a quarter to
// spare (none with MEGATRAIN_TEST_TIGHT_BUFFERS=1, so that tests grow it often) and never shrinks; before it lets go of
// the old block it waits for the device work that may still read it (wait_idle: the caller's stream, whose waits the
// caller chooses), so the allocator never hands out memory a queued kernel still uses.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "tensor/cuda/device_allocator.h"

namespace mt {

class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;
  ~GrowingBuffer() { DeviceAllocator::instance().release(data_); }

  // At least `bytes` (0: whatever it holds); wait_idle() is called first when it grows.
  template <typename T, typename WaitIdle>
  T* need(size_t bytes, WaitIdle&& wait_idle) {
    if (bytes > bytes_) {
      wait_idle();
      DeviceAllocator::instance().release(data_);
      data_ = nullptr;
      bytes_ = 0;
      const size_t want = tight() ? bytes : bytes + bytes / 4;
      data_ = DeviceAllocator::instance().allocate(want);
      bytes_ = want;
    }
    return static_cast<T*>(data_);
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  static bool tight() {
    static const bool on = [] {
      const char* env = std::getenv("MEGATRAIN_TEST_TIGHT_BUFFERS");
      return env != nullptr && std::strcmp(env, "1") == 0;
    }();
    return on;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace mt
