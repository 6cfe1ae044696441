// upcycle.h: Megatron's MoE upcycling (--moe-use-upcycling): the checkpoint of a dense model loaded into an MoE
// model of the same shape. What the two share (embeddings, attention, norms, the dense layers of --moe-layer-freq)
// loads as saved; each MoE layer's experts come from that layer's dense MLP; the router, the shared experts and the
// expert bias keep their initial values.
//
// Granular upcycling (--moe-upcycling-granularity g; Megatron's upcycling_utils, arXiv 2410.07524): the dense MLP,
// g x --moe-ffn-hidden-size wide, is cut into g slices along its hidden width (SwiGLU's gate and up each so), and
// expert e takes slice e mod g; the router's row e is its initial row e / g, so that the g experts of one dense MLP
// score alike. The experts' fc1 and fc2 (weights, and fc1's bias) are multiplied by Megatron's weight scale, which
// keeps the layer's output near the dense MLP's: the activation scale a = g (or E g / topk with
// --moe-router-pre-softmax), its cube root for SwiGLU and squared ReLU, its square root otherwise. At g = 1
// without --moe-router-pre-softmax every expert is an exact copy, and a dropless top-k layer computes the dense
// MLP's output exactly.
#pragma once

#include <optional>
#include <string>

#include "config/config.h"
#include "model/params.h"

namespace mt {

// Where one parameter of the MoE model comes from: `view` is the parameter as a slice of the dense checkpoint's tensor
// (its name and global shape the dense tensor's, its shard the slice; its offset the parameter's), `scale` multiplies it.
struct UpcycleSource {
  ParamInfo view;
  float scale = 1.0f;
};

// The dense model a run upcycles: the run's model without experts, its MLP g x --moe-ffn-hidden-size wide.
Config upcycling_dense_config(const Config& run);
// Megatron's weight scale for the experts' fc1 and fc2 (1 at g = 1 without --moe-router-pre-softmax).
double upcycling_weight_scale(const Config& run);
// The source of parameter p of the MoE model; nullopt: it keeps its initial value (the router, the shared experts,
// the expert bias).
std::optional<UpcycleSource> upcycling_source(const Config& run, const ParamInfo& p);
// The router's rows (and bias) at granularity g: row e takes the initial row e / g, in place (whole on every rank).
void repeat_router_rows(const Config& run, const ParamInfo& p, float* values);
// Refuses a --save directory that already holds a checkpoint (Megatron: upcycling is for the first run only).
void check_upcycling_destination(const Config& run);

}  // namespace mt
