// tensor.cpp: host allocation and views.
#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace mt {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

Tensor make_tensor(std::shared_ptr<Storage> storage, std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  if (device != Device::kCpu) throw std::runtime_error("Tensor::empty: device tensors come from the CUDA allocator");
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("negative tensor dimension");
    n *= d;
  }
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(n) * dtype_size(dtype);
  const size_t alloc = (st->bytes + 63) / 64 * 64 + 64;
  st->data = std::aligned_alloc(64, alloc);
  if (!st->data) throw std::bad_alloc();
  st->release = [](void* p) { std::free(p); };
  st->device = Device::kCpu;
  return make_tensor(std::move(st), std::move(shape), dtype);
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

float* Tensor::f32() const {
  if (dtype_ != DType::kF32) throw std::runtime_error("tensor is " + std::string(dtype_name(dtype_)) + ", not fp32");
  return data<float>();
}

Tensor Tensor::view(int64_t start, std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  if (start < 0 || start + n > numel()) {
    throw std::out_of_range("view of " + std::to_string(n) + " elements at " + std::to_string(start) + " exceeds " +
                            shape_str());
  }
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(start) * dtype_size(dtype_);
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
  return s + "]";
}

}  // namespace mt
