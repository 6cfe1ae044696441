// flops.h: Megatron's FLOPs-per-iteration formula (shared/REFERENCE.md section 3) and MFU.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"

namespace mt {

// FLOPs of one training iteration (forward + backward, no recompute counted), global batch of the
// resolved config. MoE layers count moe-ffn * topk.
double flops_per_iteration(const Config& cfg);
// Same for an explicit batch of `tokens` tokens (evaluation, partial batches).
double flops_for_tokens(const Config& cfg, double tokens);

// Peak dense TFLOP/s of a GPU by name ("NVIDIA H200", "NVIDIA H100 80GB HBM3", ...); 0 when unknown.
double peak_tflops_for_gpu(const std::string& name, bool fp8 = false);

}  // namespace mt
