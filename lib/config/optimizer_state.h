// optimizer_state.h: the storage types of Adam's moments. Megatron's precision-aware optimizer stores a moment in bf16
// where --exp-avg-dtype / --exp-avg-sq-dtype say so; under --optimizer-cpu-offload Megatron builds its hybrid CPU/GPU
// optimizer without these types (fp32 moments on both sides), and megatrain does the same.
#pragma once

#include "config/config.h"

namespace mt {

inline bool moment_in_bf16(const Config& c, const std::string& dtype) {
  return c.training.use_precision_aware_optimizer && !c.training.optimizer_cpu_offload && c.training.optimizer == "adam" && dtype == "bf16";
}
inline bool exp_avg_in_bf16(const Config& c) { return moment_in_bf16(c, c.training.exp_avg_dtype); }
inline bool exp_avg_sq_in_bf16(const Config& c) { return moment_in_bf16(c, c.training.exp_avg_sq_dtype); }

}  // namespace mt
