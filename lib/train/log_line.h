// log_line.h: Megatron's training and validation log lines (same fields, same order, so existing log
// parsers work) with tokens/s/GPU and MFU added at the end.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mt {

// This rank's device memory as Megatron's --log-memory-to-tensorboard reports torch's (bytes: reserved, allocated,
// the peak allocated, the live allocations) and the device's used memory at its peak, the most of any rank.
struct DeviceMemory {
  double reserved = -1;  // < 0: not measured (the CPU engine)
  double allocated = 0, max_allocated = 0, allocations = 0, peak_used = 0;
  double in_use_most = 0, max_allocated_most = 0;  // allocated and max_allocated, the most of any rank
};

struct IterationStats {
  int64_t iteration = 0, train_iters = 0, consumed_samples = 0, global_batch = 0;
  double ms_per_iter = 0, tflops_per_gpu = 0, lr = 0, loss = 0, loss_scale = 1, grad_norm = 0;
  int64_t skipped = 0, nan_iters = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = -1;  // < 0: unknown peak (CPU)
  double params_norm = -1;
  double num_zeros = -1;  // --log-num-zeros-in-grad: the last iteration's count (< 0: none, as Megatron's on a skipped step)
  bool first_iteration = false;  // the run's first iteration (Megatron's is_first_iteration: no iteration-time to TensorBoard)
  double decoupled_lr = -1;  // --decoupled-lr: the embedding's and output layer's rate (printed after the learning rate)
  DeviceMemory memory;
  std::vector<std::pair<std::string, double>> moe_losses;  // printed after the lm loss, as Megatron's
  // --moe-per-layer-logging: each loss per layer (every layer of the model, 0 for dense ones), to TensorBoard only
  std::vector<std::pair<std::string, std::vector<double>>> moe_layer_losses;
  double expert_tokens_min = -1, expert_tokens_mean = 0, expert_tokens_max = 0, dropped_fraction = 0;  // min < 0: no MoE
};

std::string format_iteration_line(const IterationStats& s);
// Megatron's " validation loss at iteration N | lm loss value: ... | lm loss PPL: ... |" between dashed rules; `where` follows
// the iteration: "" during training, " on validation set" / " on test set" for the evaluations after the last iteration.
std::string format_validation_line(int64_t iteration, double loss, const std::string& where = "");
std::string timestamp_now();

}  // namespace mt
