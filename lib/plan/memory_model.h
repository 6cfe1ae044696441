// memory_model.h: estimated GPU memory of one rank (weights, gradients, optimizer state, activations
// of the microbatches in flight) and Megatron's own theoretical formula for comparison.
// docs/memory-model.md derives every term.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

struct MemoryEstimate {
  int64_t params = 0;             // parameters on the rank
  double weights = 0;             // bytes
  double grads = 0;               // fp32 main gradients
  double optimizer = 0;           // master weights + Adam moments (sharded with the distributed optimizer)
  double optimizer_unsharded = 0; // the same without the distributed optimizer
  double optimizer_sharded = 0;   // the same with it
  double activations_per_microbatch = 0;
  double in_flight_microbatches = 1;  // the schedule's peak, in microbatches of the whole stage
  double activations = 0;         // per microbatch x in flight (+ the MLP buffers shared by selectively recomputed layers)
  double logits = 0;              // output layer and loss (last stage): one chunk of rows' logits
  double working = 0;             // one microbatch's working buffers (gradients in flight through a layer, FP8 copies)
  double overhead = 0;            // CUDA context, cuBLAS / cuDNN workspaces, NCCL (measured, not derived)
  double total = 0;
  int64_t stage = 0;              // the pipeline stage estimated (most loaded)
};

// Most loaded rank of the layout (resolved config).
MemoryEstimate estimate_memory(const Config& cfg);
// Per pipeline stage.
MemoryEstimate estimate_memory_for_stage(const Config& cfg, int64_t stage);

// The rows of logits the CUDA engine's output layer takes at a time (lib/model/cuda: about 512 MiB of bf16
// logits, a multiple of 64 rows, at most the microbatch's tokens).
int64_t output_layer_chunk_rows(int64_t vocab_local, int64_t tokens);

struct MegatronTheoretical {
  double weights_and_optimizer = 0;  // bytes, most loaded shard
  double activations = 0;            // bytes, first stage
};
// megatron/training/theoretical_memory_usage.py, transcribed (selective recompute + SP variant when
// both are on, else the variant without SP).
MegatronTheoretical megatron_theoretical_memory(const Config& cfg);

}  // namespace mt
