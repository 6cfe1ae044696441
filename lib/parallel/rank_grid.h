// rank_grid.h: Megatron's RankGenerator. Ranks laid out over named dimensions (tp, cp, ep, dp, pp) in a
// given order, the first dimension varying fastest; a group over a set of dimensions is the ranks that
// agree on every other coordinate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

class RankGrid {
 public:
  // order: dimension names joined by '-', e.g. "tp-cp-ep-dp-pp". sizes: size of each named dimension.
  RankGrid(int64_t tp, int64_t cp, int64_t ep, int64_t dp, int64_t pp, const std::string& order);

  int64_t world_size() const { return world_; }
  int64_t size(const std::string& dim) const;
  int64_t coord(int64_t rank, const std::string& dim) const;
  // Every group spanning the dimensions in `dims` ("tp", "dp-cp", "tp-ep-pp"), each sorted by the
  // inner order; groups enumerated as Megatron enumerates them.
  std::vector<std::vector<int64_t>> groups(const std::string& dims) const;
  // The group over `dims` that holds `rank`.
  std::vector<int64_t> group_of(int64_t rank, const std::string& dims) const;
  const std::vector<std::string>& order() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> strides_;
  int64_t world_ = 1;
  size_t index_of(const std::string& dim) const;
};

}  // namespace mt
