// moe_traffic.h: the token dispatcher's traffic per GPU that `megatrain plan` prints for an MoE model: what each
// rank sends per MoE layer and microbatch (EP all-to-all or all-gather, expert-TP gather / reduce-scatter),
// per iteration, and how long that takes at an assumed bandwidth beside the iteration's compute.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace mt {

struct MoeTraffic {
  double ep_bytes = 0;      // one dispatch (or combine) over EP, per MoE layer and microbatch, sent per GPU
  double etp_bytes = 0;     // the expert-TP all-gather (or reduce-scatter) that follows it
  int64_t exchanges = 0;    // dispatches + combines per MoE layer and microbatch: 4 (forward, backward), 6 with full recompute
  int64_t moe_layers = 0;   // MoE layers on the most loaded pipeline stage
  double step_bytes = 0;    // per GPU per iteration
  bool inter_node = false;  // the EP group spans nodes
  double gbps = 0;          // assumed bandwidth (GB/s per GPU): NVLink inside a node, the network across nodes
  double seconds = 0;       // step_bytes at that bandwidth
};

// Zero traffic without experts. gpus_per_node: where the EP groups sit (ranks of one EP group on one node or not).
MoeTraffic moe_traffic(const Config& cfg, int64_t gpus_per_node);

}  // namespace mt
