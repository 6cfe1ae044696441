// cp_traffic.h: context parallelism's traffic per GPU that `megatrain plan` prints: p2p's K/V blocks around the
// ring (and their gradients back) or a2a's all-to-alls, per layer and microbatch and per iteration, and whether a
// ring step's transfer hides behind its block attention at an assumed bandwidth and TFLOP/s.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

struct CpTraffic {
  double layer_bytes = 0;      // one layer's forward + backward (+ recompute) of one microbatch, sent per GPU
  double step_bytes = 0;       // per iteration (the most loaded pipeline stage's layers)
  double block_bytes = 0;      // p2p: one ring step's K/V block
  double block_seconds = 0;    // p2p: its transfer at the bandwidth
  double compute_seconds = 0;  // p2p: one ring step's block attention (forward) at the TFLOP/s
  bool inter_node = false;     // the CP group spans nodes
  double gbps = 0;             // assumed: 150 GB/s inside a node, 40 across
  double seconds = 0;          // step_bytes at that bandwidth
};

// Zero without CP.
CpTraffic cp_traffic(const Config& cfg, int64_t gpus_per_node, double gpu_tflops);

}  // namespace mt
