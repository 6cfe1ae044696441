// replica_check.cpp: each value's largest and smallest over the group (a max of x and of -x) against this rank's.
#include "train/replica_check.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace mt {

std::vector<size_t> realtime_test_params(const ParamStore& params) {
  std::vector<size_t> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params.info(i).name;
    if (name.find("attention.q_norm.") != std::string::npos || name.find("attention.k_norm.") != std::string::npos) out.push_back(i);
  }
  return out;
}

void check_replicas_equal(const ParamStore& params, const std::vector<size_t>& which, Communicator& group, const std::string& group_name) {
  if (group.size() <= 1 || which.empty()) return;
  // Per value its bit pattern (as Megatron's torch.all(src == tgt) compares, but a NaN on one rank counts too: the
  // patterns are plain numbers), then minus it: their maxima are the largest pattern and minus the smallest.
  std::vector<double> extremes;
  for (size_t i : which) {
    const float* x = params.param(i);
    for (int64_t k = 0; k < params.info(i).numel; ++k) {
      uint32_t bits = 0;
      std::memcpy(&bits, &x[k], sizeof(bits));
      extremes.push_back(static_cast<double>(bits));
      extremes.push_back(-static_cast<double>(bits));
    }
  }
  group.all_reduce(extremes.data(), static_cast<int64_t>(extremes.size()), ReduceOp::kMax);
  size_t at = 0;
  for (size_t i : which) {
    int64_t differing = 0;
    for (int64_t k = 0; k < params.info(i).numel; ++k, at += 2) differing += extremes[at] + extremes[at + 1] > 0 ? 1 : 0;
    if (differing > 0) {
      throw std::runtime_error("--test-mode: " + params.info(i).name + " differs between the " + group_name + " ranks (" + std::to_string(differing) +
                               " of its values): a replica was corrupted (memory or a transfer); restart from the last checkpoint");
    }
  }
}

}  // namespace mt
