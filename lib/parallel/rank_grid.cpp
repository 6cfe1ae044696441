// rank_grid.cpp: the masked orthogonal rank groups of Megatron's parallel_state.
#include "parallel/rank_grid.h"

#include <sstream>
#include <stdexcept>

namespace mt {
namespace {

std::vector<std::string> split_dims(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, '-')) {
    if (!tok.empty()) out.push_back(tok);
  }
  return out;
}

}  // namespace

RankGrid::RankGrid(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp, const std::string& order) {
  const std::vector<std::pair<std::string, int64_t>> all = {{"tp", tp}, {"cp", cp}, {"ep", ep}, {"dp", dp}, {"pp", pp}};
  names_ = split_dims(order);
  for (const auto& [name, sz] : all) {
    bool present = false;
    for (const auto& n : names_) present |= (n == name);
    if (!present) {
      if (sz != 1) throw std::invalid_argument("rank order '" + order + "' lacks dimension " + name + " of size " + std::to_string(sz));
      names_.push_back(name);
    }
  }
  for (const auto& n : names_) {
    int64_t sz = 0;
    for (const auto& [name, v] : all) {
      if (name == n) sz = v;
    }
    if (sz < 1) throw std::invalid_argument("rank order '" + order + "' names unknown dimension '" + n + "'");
    strides_.push_back(world_);
    sizes_.push_back(sz);
    world_ *= sz;
  }
}

size_t RankGrid::index_of(const std::string& dim) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == dim) return i;
  }
  throw std::invalid_argument("unknown parallel dimension '" + dim + "'");
}

int64_t RankGrid::size(const std::string& dim) const { return sizes_[index_of(dim)]; }

int64_t RankGrid::coord(int64_t rank, const std::string& dim) const {
  const size_t i = index_of(dim);
  return (rank / strides_[i]) % sizes_[i];
}

std::vector<std::vector<int64_t>> RankGrid::groups(const std::string& dims) const {
  std::vector<bool> mask(names_.size(), false);
  for (const auto& d : split_dims(dims)) mask[index_of(d)] = true;
  std::vector<int64_t> in_shape, in_stride, out_shape, out_stride;
  for (size_t i = 0; i < names_.size(); ++i) {
    (mask[i] ? in_shape : out_shape).push_back(sizes_[i]);
    (mask[i] ? in_stride : out_stride).push_back(strides_[i]);
  }
  auto count = [](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (auto v : shape) n *= v;
    return n;
  };
  // Mixed-radix digits of i over shape, dotted with strides.
  auto place = [](int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
    int64_t r = 0;
    for (size_t k = 0; k < shape.size(); ++k) {
      r += (i % shape[k]) * stride[k];
      i /= shape[k];
    }
    return r;
  };
  const int64_t group_size = count(in_shape), num_groups = count(out_shape);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t base = place(g, out_shape, out_stride);
    auto& grp = out[static_cast<size_t>(g)];
    for (int64_t r = 0; r < group_size; ++r) grp.push_back(base + place(r, in_shape, in_stride));
  }
  return out;
}

std::vector<int64_t> RankGrid::group_of(int64_t rank, const std::string& dims) const {
  for (auto& g : groups(dims)) {
    for (auto r : g) {
      if (r == rank) return g;
    }
  }
  throw std::out_of_range("rank " + std::to_string(rank) + " outside world of " + std::to_string(world_));
}

}  // namespace mt
