// params.cpp: flat parameter buffers and layout-independent initialisation.
#include "model/params.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "config/errors.h"
#include "tensor/rng.h"

namespace mt {

size_t ParamStore::add(ParamInfo info) {
  if (params_.defined()) throw std::logic_error("ParamStore::add after allocate");
  int64_t n = 1;
  for (auto d : info.local_shape) n *= d;
  info.numel = n;
  info.offset = total_;
  total_ += n;
  infos_.push_back(std::move(info));
  return infos_.size() - 1;
}

std::pair<int64_t, int64_t> ParamStore::group_range(GradGroup g) const {
  int64_t lo = total_, hi = 0;
  for (const ParamInfo& p : infos_) {
    if (p.grad_group != g || !p.trainable) continue;  // (the buffers at the end belong to no group)
    lo = std::min(lo, p.offset);
    hi = std::max(hi, p.offset + p.numel);
  }
  if (lo >= hi) return {g == GradGroup::kDense ? 0 : total_, g == GradGroup::kDense ? 0 : total_};
  return {lo, hi};
}

void ParamStore::allocate() {
  // The dense parameters first, the experts' after them: each gradient group one flat range (a dense model's
  // offsets are its registration order, as before). Last the buffers that no optimizer updates (the expert bias):
  // the trainable parameters then lie in one range from 0, as the optimizer state does.
  // Each parameter starts on a multiple of kParamAlignment elements (as Megatron's gradient buffer pads its
  // parameters' starts): the CUDA engine's GEMMs load 16-byte vectors from the views into the flat buffers.
  // A parameter whose size is no such multiple (the attention sinks' [heads], a norm of odd width) leaves a
  // gap of zeros after it that belongs to no parameter: the optimizer's segments, the norms, the zero count
  // and the checkpoints go by parameter and never see it; a data-parallel bucket reduces its zeros.
  int64_t off = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (ParamInfo& p : infos_) {
      if ((!p.trainable ? 2 : p.grad_group == GradGroup::kExpert ? 1 : 0) != pass) continue;
      off = (off + kParamAlignment - 1) / kParamAlignment * kParamAlignment;
      p.offset = off;
      off += p.numel;
    }
  }
  total_ = off;
  // Weights and gradients in fp32 on the host: said before trying, with the remedies, when the machine cannot
  // hold them (std::bad_alloc names nothing).
  const double need = 8.0 * static_cast<double>(total_);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return std::string(buf);
  };
  const std::string remedy = ": use more ranks (--tensor-model-parallel-size / --pipeline-model-parallel-size), a smaller model, or the CUDA engine "
                             "(`megatrain plan` shows the memory per rank)";
  if (have > 0 && need > have) {
    throw ConfigError("this rank's " + std::to_string(total_) + " parameters need " + gib(need) + " of host memory for weights and gradients, more than the " +
                      gib(have) + " this machine has" + remedy);
  }
  try {
    params_ = Tensor::zeros({total_});
    grads_ = Tensor::zeros({total_});
  } catch (const std::bad_alloc&) {
    throw ConfigError("out of host memory allocating " + gib(need) + " for this rank's weights and gradients" + remedy);
  }
}

size_t ParamStore::index_of(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (infos_[i].name == name) return i;
  }
  throw std::out_of_range("no parameter named " + name);
}

int64_t ParamStore::global_index(size_t i, int64_t local) const {
  const ParamInfo& p = infos_[i];
  if (p.shard_dim < 0 || p.shard_count == 1) return local;
  // Row-major: split the local index into (outer, shard dim, inner) and offset the shard dim.
  const auto& ls = p.local_shape;
  const auto& gs = p.global_shape;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(p.shard_dim) + 1; d < ls.size(); ++d) inner *= ls[d];
  const int64_t dim_local = ls[static_cast<size_t>(p.shard_dim)];
  const int64_t dim_global = gs[static_cast<size_t>(p.shard_dim)];
  const int64_t in = local % inner;
  const int64_t mid = (local / inner) % dim_local;
  const int64_t outer = local / (inner * dim_local);
  return (outer * dim_global + p.shard_rank * dim_local + mid) * inner + in;
}

void ParamStore::initialize(uint64_t seed) {
  // Every element is a pure function of (seed, name, global index): threads split the work freely.
  const unsigned nthreads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    float* w = param(i);
    auto fill = [&, i](int64_t lo, int64_t hi) { initial_values(i, seed, w, lo, hi); };
    if (p.numel < (1 << 20) || nthreads == 1) {
      fill(0, p.numel);
      continue;
    }
    std::vector<std::thread> pool;
    const int64_t chunk = (p.numel + nthreads - 1) / nthreads;
    for (unsigned t = 0; t < nthreads; ++t) {
      const int64_t lo = t * chunk, hi = std::min(p.numel, lo + chunk);
      if (lo < hi) pool.emplace_back(fill, lo, hi);
    }
    for (auto& th : pool) th.join();
  }
}

void ParamStore::initial_values(size_t i, uint64_t seed, float* out, int64_t lo, int64_t hi) const {
  const ParamInfo& p = infos_[i];
  const uint64_t key = rng_key(seed, p.name);
  for (int64_t e = lo; e < hi; ++e) {
    switch (p.init) {
      case InitKind::kZeros: out[e] = 0.0f; break;
      case InitKind::kOnes: out[e] = 1.0f; break;
      case InitKind::kNormal: out[e] = p.init_std * philox_normal(key, static_cast<uint64_t>(global_index(i, e))); break;
    }
  }
}

void ParamStore::zero_grads() { std::memset(grads_.raw(), 0, grads_.nbytes()); }

}  // namespace mt
