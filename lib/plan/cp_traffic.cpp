// cp_traffic.cpp: see cp_traffic.h.
#include "plan/cp_traffic.h"

#include <algorithm>

#include "config/resolve.h"

namespace mt {

CpTraffic cp_traffic(const Config& c, int64_t gpus_per_node, double gpu_tflops) {
  CpTraffic t;
  const auto& p = c.parallel;
  const double cp = static_cast<double>(p.context_parallel_size);
  if (cp <= 1) return t;
  const double tp = static_cast<double>(p.tensor_model_parallel_size);
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double s = static_cast<double>(c.data.seq_length.value_or(0));
  const double h = static_cast<double>(c.model.hidden_size.value_or(0));
  const double n = static_cast<double>(c.model.num_attention_heads.value_or(1));
  // (multi-latent attention: its query / key heads' width, every head with its own key and value)
  const double d = static_cast<double>(c.model.multi_latent_attention ? c.model.qk_head_dim + c.model.qk_pos_emb_head_dim
                                                                      : c.model.kv_channels.value_or(static_cast<int64_t>(h / n)));
  const double g = std::max(1.0, (c.model.multi_latent_attention ? n : static_cast<double>(effective_query_groups(c))) / tp);
  const double heads = n / tp;
  const double el = (c.precision.bf16 || c.precision.fp16) ? 2.0 : 4.0;
  const bool recompute = c.recompute.recompute_granularity.value_or("") == "full";
  const double tokens = b * s / cp;  // this rank's share of the microbatch
  if (p.cp_comm_type == "a2a") {
    // Q, K, V in and the output back, forward; their gradients the other way: (CP - 1) / CP of each leaves the rank.
    const double one = tokens * (2.0 * heads + 2.0 * g) * d * el * (cp - 1.0) / cp;
    t.layer_bytes = one * (2.0 + (recompute ? 1.0 : 0.0));
  } else {
    t.block_bytes = 2.0 * tokens * g * d * el;  // K and V of this rank's tokens
    // Forward: CP - 1 passes of K/V; backward: CP passes of K/V with dK/dV (twice the bytes).
    t.layer_bytes = (cp - 1.0) * t.block_bytes * (1.0 + (recompute ? 1.0 : 0.0)) + cp * 2.0 * t.block_bytes;
    t.compute_seconds = 2.0 * 2.0 * b * (s / cp) * (s / cp) * heads * d * 0.5 / (gpu_tflops * 1e12);  // causal: half the pairs on average
  }
  const std::vector<int64_t> stages = layers_per_pipeline_stage(c);
  const double layers = static_cast<double>(stages.empty() ? c.model.num_layers.value_or(0) : *std::max_element(stages.begin(), stages.end()));
  t.step_bytes = t.layer_bytes * layers * static_cast<double>(c.derived.num_microbatches);
  t.inter_node = static_cast<double>(gpus_per_node) < tp * cp;
  t.gbps = t.inter_node ? 40.0 : 150.0;
  t.seconds = t.step_bytes / (t.gbps * 1e9);
  t.block_seconds = t.block_bytes / (t.gbps * 1e9);
  return t;
}

}  // namespace mt
