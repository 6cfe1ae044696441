// moe_traffic.cpp: see moe_traffic.h. Uniform routing assumed: each token's k choices spread evenly over the
// experts, so (EP - 1) / EP of them leave the rank.
#include "plan/moe_traffic.h"

#include <algorithm>

#include "config/moe_pattern.h"
#include "config/resolve.h"
#include "parallel/rank_layout.h"

namespace mt {

MoeTraffic moe_traffic(const Config& c, int64_t gpus_per_node) {
  MoeTraffic t;
  if (!c.moe.num_experts) return t;
  const auto& p = c.parallel;
  const double ep = static_cast<double>(p.expert_model_parallel_size);
  const double etp = static_cast<double>(p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size));
  const double tp = static_cast<double>(p.tensor_model_parallel_size);
  const bool sp = p.sequence_parallel && p.tensor_model_parallel_size > 1;
  const double tokens = static_cast<double>(c.training.micro_batch_size.value_or(1)) * static_cast<double>(c.data.seq_length.value_or(0)) /
                        static_cast<double>(p.context_parallel_size) / (sp ? tp : 1.0);
  const double h = static_cast<double>(c.model.hidden_size.value_or(0));
  const double bytes = (c.precision.bf16 || c.precision.fp16) ? 2.0 : 4.0;
  const double k = static_cast<double>(c.moe.moe_router_topk);
  if (c.moe.moe_token_dispatcher_type == "allgather") {
    t.ep_bytes = (ep - 1.0) * tokens * h * bytes;  // every rank's tokens to every EP rank
  } else {
    t.ep_bytes = tokens * k * (ep - 1.0) / ep * h * bytes;
  }
  t.etp_bytes = (etp - 1.0) * tokens * k * h * bytes;  // each expert-TP rank's ~tokens x k rows to the others
  t.exchanges = c.recompute.recompute_granularity.value_or("") == "full" ? 6 : 4;
  // MoE layers of the most loaded stage.
  const std::vector<bool> pattern = moe_layer_pattern(c);
  const std::vector<int64_t> stages = layers_per_pipeline_stage(c);
  int64_t first = 0;
  for (int64_t n : stages) {
    int64_t m = 0;
    for (int64_t l = first; l < first + n && l < static_cast<int64_t>(pattern.size()); ++l) m += pattern[static_cast<size_t>(l)] ? 1 : 0;
    t.moe_layers = std::max(t.moe_layers, m);
    first += n;
  }
  const double microbatches = static_cast<double>(c.derived.num_microbatches);
  t.step_bytes = (t.ep_bytes + t.etp_bytes) * static_cast<double>(t.exchanges) * static_cast<double>(t.moe_layers) * microbatches;
  // An EP group's ranks are TP x CP apart in the expert grid's rank order only through ETP: on one node when
  // ETP x EP fits it (Megatron's folding keeps expert groups inside the TP x CP x DP ranks of a stage).
  t.inter_node = static_cast<double>(gpus_per_node) < ep * etp;
  t.gbps = t.inter_node ? 40.0 : 150.0;
  t.seconds = t.step_bytes / (t.gbps * 1e9);
  return t;
}

}  // namespace mt
