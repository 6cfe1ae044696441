// tensor.h: Tensor = shape + dtype + device + a view (offset) into shared storage. Host storage is
// 64-byte aligned; device storage comes from the CUDA backend's caching allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace mt {

enum class Device : uint8_t { kCpu, kCuda };

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::kCpu;
  std::function<void(void*)> release;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (data && release) release(data);
  }
};

class Tensor {
 public:
  Tensor() = default;
  // New zero-filled host tensor.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::kF32);
  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::kF32, Device device = Device::kCpu);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::kCpu; }
  bool defined() const { return storage_ != nullptr; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_bytes_; }
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }
  float* f32() const;

  // A contiguous view of `count` elements starting at element `start`, reshaped to `shape`.
  Tensor view(int64_t start, std::vector<int64_t> shape) const;
  Tensor reshape(std::vector<int64_t> shape) const { return view(0, std::move(shape)); }
  std::string shape_str() const;

 private:
  std::shared_ptr<Storage> storage_;
  std::vector<int64_t> shape_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::kF32;
  friend Tensor make_tensor(std::shared_ptr<Storage>, std::vector<int64_t>, DType);
};

Tensor make_tensor(std::shared_ptr<Storage> storage, std::vector<int64_t> shape, DType dtype);

}  // namespace mt
