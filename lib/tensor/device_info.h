// device_info.h: which GPUs this process sees (name, memory, compute capability, peak bf16 TFLOP/s
// for MFU). Compiled with the CUDA runtime when the CUDA backend is built; reports none otherwise.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

namespace mt {

struct GpuInfo {
  int index = 0;
  std::string name;
  size_t memory_bytes = 0;
  int major = 0, minor = 0;
  int sm_count = 0;
};

// Empty when the build has no CUDA backend, no driver is loaded, or no device is visible.
std::vector<GpuInfo> visible_gpus();
// Why no GPU is visible (for messages), "" when some are.
std::string gpu_unavailable_reason();
bool built_with_cuda();
// Makes GPU `index` current for this process (CUDA builds; a no-op otherwise).
void set_cuda_device(int index);

// A CUDA feature that is written but has never run on a GPU stays refused by name; on a GPU machine a developer
// lifts that refusal to test it with MEGATRAIN_CUDA_UNVERIFIED=<name>[,<name>...] (docs/cuda-engine.md). Names:
// context-parallel, pipeline-parallel, moe-data-parallel, expert-parallel, moe-tensor-parallel, qkv-bias-tensor-parallel,
// fp8-tensor-parallel, fp8-amax-data-parallel, fp8-expert-parallel, expert-tensor-parallel, window-size (blockwise FP8, the document masks, attention dropout, MoE shared experts and group-limited routing,
// seq_aux_loss and global_aux_loss, squared ReLU, interleaved RoPE, the MoE expert bias, capacity factors, MoE's per-token loss, --add-qkv-bias, MoE in fp16, FP8 in MoE layers, --moe-router-force-load-balancing, upcycling, sinkhorn routing and the shared expert's gate were ones until their GPU
// tests passed).
inline bool cuda_unverified_allowed(const std::string& name) {
  const char* env = std::getenv("MEGATRAIN_CUDA_UNVERIFIED");
  if (env == nullptr) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find("," + name + ",") != std::string::npos;
}

}  // namespace mt
