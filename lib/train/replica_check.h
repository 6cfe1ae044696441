// replica_check.h: Megatron's --test-mode real-time test (Attention.run_realtime_tests): the parameters every rank of a
// group holds whole (the query / key norms under --qk-layernorm) must be the same on all of them; a difference is a
// silent corruption (memory, a transfer) and ends the run naming the parameter and the group.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"

namespace mt {

// The parameters Megatron's test compares: the query and key norms' weights and biases.
std::vector<size_t> realtime_test_params(const ParamStore& params);

// Throws std::runtime_error when one of `which` differs between the ranks of `group` (a collective: every rank calls it).
void check_replicas_equal(const ParamStore& params, const std::vector<size_t>& which, Communicator& group, const std::string& group_name);

}  // namespace mt
