// memory_model.cpp: per-rank memory estimate; see docs/memory-model.md for the terms.
#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>

#include "config/moe_pattern.h"
#include "config/optimizer_state.h"
#include "config/resolve.h"
#include "plan/param_count.h"
#include "plan/pipeline_plan.h"

namespace mt {
namespace {

// What the process holds beyond its buffers: the CUDA context, cuBLAS / cuDNN workspaces, the microbatch staging
// (measured on one H200: 0.54-0.56 GiB, docs/memory-model.md), rounded up to 1 GiB; with more GPUs NCCL's
// communicators and their buffers too, 2 GiB (assumed: not yet measured).
constexpr double kOverheadOneGpu = 1.0 * (1ull << 30), kOverheadNccl = 2.0 * (1ull << 30);

bool half_precision(const Config& c) { return c.precision.bf16 || c.precision.fp16; }

// The model's sizes on one rank as the estimates below use them.
struct RankShape {
  double h, n, d, g, t;
  bool sp;
  double rep;  // what sequence parallelism splits over TP (t under SP, else 1)
  double a;    // activation element size
  double res;  // the CUDA engine's residual stream element size (fp32 with --fp32-residual-connection)
  explicit RankShape(const Config& c)
      : h(static_cast<double>(c.model.hidden_size.value_or(0))),
        n(static_cast<double>(c.model.num_attention_heads.value_or(1))),
        // (multi-latent attention: its query / key heads' width, every head with its own key and value)
        d(static_cast<double>(c.model.multi_latent_attention ? c.model.qk_head_dim + c.model.qk_pos_emb_head_dim
                                                             : c.model.kv_channels.value_or(static_cast<int64_t>(h / n)))),
        g(c.model.multi_latent_attention ? n : static_cast<double>(effective_query_groups(c))),
        t(static_cast<double>(c.parallel.tensor_model_parallel_size)),
        sp(c.parallel.sequence_parallel && c.parallel.tensor_model_parallel_size > 1),
        rep(sp ? t : 1.0),
        a(half_precision(c) ? 2.0 : 4.0),
        res(c.precision.fp32_residual_connection || !half_precision(c) ? 4.0 : a) {}
};

// The experts' rows per token of an MoE layer: its top-k choices, or padded to capacity (--moe-pad-expert-input-to-capacity)
// every expert's capacity, capacity factor x top-k per token, at most every expert.
double expert_rows_per_token(const Config& c) {
  const double k = static_cast<double>(c.moe.moe_router_topk);
  if (!c.moe.moe_pad_expert_input_to_capacity || !c.moe.moe_expert_capacity_factor) return k;
  return std::max(k, std::min(static_cast<double>(c.moe.num_experts.value_or(1)), *c.moe.moe_expert_capacity_factor * k));
}

// Bytes of activations one transformer layer keeps for backward, per microbatch, on one rank.
// The MLP block's own buffers of one layer (what selective recompute of mlp / moe leaves out of a layer, keeping its
// input, the norm output): dense, fc1's output(s) and the activation; MoE, the router's logits, the permuted tokens and
// the experts' outputs, the choices, the experts' fc1 outputs and activations, and the shared expert's.
// An MoE layer's routed experts' 16-bit activation output (the CUDA engine: none under delayed scaling's fused SwiGLU
// without biases, where nothing reads it).
double expert_activation_bytes(const Config& c) {
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double s = static_cast<double>(c.data.seq_length.value_or(0)) / static_cast<double>(c.parallel.context_parallel_size);
  const RankShape r(c);
  const bool fp8_wgrad = !(c.precision.no_fp8_wgrad && c.precision.fp8_recipe == "delayed");
  const bool act_unread = plain_swiglu(c.model) && c.precision.fp8_format && c.precision.fp8_recipe == "delayed" && fp8_wgrad && !c.precision.fp16;
  if (act_unread && c.model.disable_bias_linear) return 0;
  const double F = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(
      c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(r.h), c.model.swiglu))));
  double tokens = s * b * expert_rows_per_token(c);
  if (c.precision.fp8_format) tokens += 15.0 * static_cast<double>(c.moe.num_experts.value_or(0) / std::max<int64_t>(1, c.parallel.expert_model_parallel_size));
  const double etp = static_cast<double>(c.parallel.expert_tensor_parallel_size.value_or(c.parallel.tensor_model_parallel_size));
  return r.a * tokens * F / etp;
}

// Whether MoE layer l keeps its routed experts' activation in one buffer that the layers share (the CUDA engine's
// CudaGPT::expert_act_shared): an FP8 layer (its backward reads none) or --recompute-modules moe_act, where the whole
// block is not recomputed.
bool expert_activation_shared(const Config& c, int64_t l, bool mlp_recompute) {
  const auto& pr = c.precision;
  const int64_t L = c.model.num_layers.value_or(0);
  const bool fp8_layer = pr.fp8_format && (!pr.first_last_layers_bf16 || (l >= pr.num_layers_at_start_in_bf16 && l < L - pr.num_layers_at_end_in_bf16));
  return !mlp_recompute && (fp8_layer || c.recompute.recomputes("moe_act"));
}

double mlp_block_bytes(const Config& c, bool moe, bool shared_only) {
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double s = static_cast<double>(c.data.seq_length.value_or(0)) / static_cast<double>(c.parallel.context_parallel_size);
  const RankShape r(c);
  const double h = r.h, t = r.t, a = r.a, rep = r.rep;
  const double sb = s * b;
  const double mult = gated_mlp(c.model) ? 2.0 : 1.0;
  const bool fp8_wgrad = !(c.precision.no_fp8_wgrad && c.precision.fp8_recipe == "delayed");
  // The CUDA engine under delayed scaling: SwiGLU writes fc2's FP8 input, and with FP8 weight gradients nothing keeps
  // its 16-bit output (the routed experts' too, where they have no biases).
  const bool act_unread = plain_swiglu(c.model) && c.precision.fp8_format && c.precision.fp8_recipe == "delayed" && fp8_wgrad && !c.precision.fp16;
  double F = static_cast<double>(c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(h), c.model.swiglu)));
  if (!moe) return a * sb * F * (mult + (act_unread ? 0 : 1)) / t;  // fc1 output(s) and activation output
  F = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F)));
  double tokens = sb * expert_rows_per_token(c);
  // (FP8 on the CUDA engine: each expert's rows start at a multiple of 16, up to 15 rows of padding each)
  if (c.precision.fp8_format) tokens += 15.0 * static_cast<double>(c.moe.num_experts.value_or(0) / std::max<int64_t>(1, c.parallel.expert_model_parallel_size));
  double bytes = 4.0 * sb * static_cast<double>(c.moe.num_experts.value_or(0));  // router logits (fp32)
  bytes += 2 * a * tokens * h / rep;                                               // permuted tokens, the experts' outputs
  bytes += 12.0 * sb * static_cast<double>(c.moe.moe_router_topk);                 // the choices, their weights and rows
  const double etp = static_cast<double>(c.parallel.expert_tensor_parallel_size.value_or(c.parallel.tensor_model_parallel_size));
  // (the experts' fc1 outputs and activations: where rows travel, over EP or expert-TP's gather, they grow in each
  // layer's own buffers, which selective recompute does not share)
  const bool travel = c.parallel.expert_model_parallel_size > 1 || (etp > 1 && etp != t);
  if (!(shared_only && travel)) bytes += a * tokens * F * mult / etp + expert_activation_bytes(c);
  const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0));
  bytes += a * sb * shared * (mult + 1) / t;  // the shared expert's fc1 output(s) and activation output
  return bytes;
}

// Multi-latent attention's up projections' outputs per microbatch (the CUDA engine's, model/cuda/gpt_cuda.cpp): the
// queries and keys (n heads of dn + dr), the values (n of dv), and with --qk-layernorm the normed latents and their norms'
// statistics (this TP rank's heads; the latents whole). A layer keeps its own, or with --recompute-modules mla_up_proj every
// layer shares one set.
double mla_up_bytes(const Config& c, double sb) {
  const auto& m = c.model;
  const double a = half_precision(c) ? 2.0 : 4.0;
  const double n = static_cast<double>(m.num_attention_heads.value_or(1)) / static_cast<double>(c.parallel.tensor_model_parallel_size);  // (this rank's heads)
  const double d = static_cast<double>(m.qk_head_dim + m.qk_pos_emb_head_dim), dv = static_cast<double>(m.v_head_dim);
  const double rq = static_cast<double>(m.q_lora_rank.value_or(0)), rkv = static_cast<double>(m.kv_lora_rank);
  double bytes = a * sb * (2 * n * d + n * dv);
  if (m.qk_layernorm) bytes += a * sb * (rq + rkv) + 8.0 * sb * ((rq > 0 ? 1.0 : 0.0) + 1.0);
  return bytes;
}

// ... and the rest of its attention per layer: the latents before their norms, the attention's output (n heads of dv) and
// statistics, and with the up projections recomputed the rotated k_pe (dr) kept in their place.
double mla_layer_bytes(const Config& c, double sb, bool up_shared) {
  const auto& m = c.model;
  const double a = half_precision(c) ? 2.0 : 4.0;
  const double n = static_cast<double>(m.num_attention_heads.value_or(1)) / static_cast<double>(c.parallel.tensor_model_parallel_size);
  const double dv = static_cast<double>(m.v_head_dim), rq = static_cast<double>(m.q_lora_rank.value_or(0));
  double bytes = a * sb * (rq + static_cast<double>(m.kv_lora_rank) + n * dv) + 4.0 * sb * n;
  bytes += up_shared ? a * sb * static_cast<double>(m.qk_pos_emb_head_dim) : mla_up_bytes(c, sb);
  return bytes;
}

bool mla_up_shared(const Config& c) { return c.model.multi_latent_attention && c.recompute.recomputes("mla_up_proj"); }

double layer_activation_bytes(const Config& c, bool moe, bool full_recompute, bool mlp_recompute, bool expert_act_shared = false) {
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double s = static_cast<double>(c.data.seq_length.value_or(0)) / static_cast<double>(c.parallel.context_parallel_size);
  const RankShape r(c);
  const double h = r.h, n = r.n, d = r.d, g = r.g, t = r.t, a = r.a, rep = r.rep;
  const double sb = s * b;
  if (full_recompute) return a * sb * h / rep;  // only the layer input is kept
  double bytes = 0;
  bytes += 2 * a * sb * h / rep;                        // inputs of the two norms (residual stream)
  bytes += a * sb * h / rep;                            // QKV GEMM input (norm output)
  if (c.model.multi_latent_attention) {  // (the CUDA engine's MLA: one TP rank)
    bytes += mla_layer_bytes(c, sb, mla_up_shared(c));
  } else {
    bytes += a * sb * (n * d + 2 * std::max(g, 1.0) * d) / t;  // Q, K, V
    bytes += a * sb * n * d / t + 4.0 * sb * n / t;       // attention output + softmax statistics (flash)
  }
  if (c.model.hidden_dropout > 0) bytes += 2 * sb * h / rep;  // two dropout masks, 1 byte each
  bytes += a * sb * h / rep;  // fc1 input (norm output)
  // (selective recompute of the block: what it shares leaves the layer; under EP the experts' rows stay, see mlp_block_bytes)
  bytes += mlp_recompute ? mlp_block_bytes(c, moe, false) - mlp_block_bytes(c, moe, true) : mlp_block_bytes(c, moe, false);
  if (moe && expert_act_shared) bytes -= expert_activation_bytes(c);  // (counted once per chunk instead)
  const bool fp8_wgrad = !(c.precision.no_fp8_wgrad && c.precision.fp8_recipe == "delayed");
  double F = static_cast<double>(c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(h), c.model.swiglu)));
  if (moe) {
    F = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F)));
    if (c.precision.fp8_format) {  // FP8 (tensorwise / blockwise): the GEMM inputs' transposes, 1 byte (blockwise: and their scales)
      double tokens = sb * expert_rows_per_token(c) + 15.0 * static_cast<double>(c.moe.num_experts.value_or(0) /
                                                                                  std::max<int64_t>(1, c.parallel.expert_model_parallel_size));
      const double etp = static_cast<double>(c.parallel.expert_tensor_parallel_size.value_or(c.parallel.tensor_model_parallel_size));
      const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0));
      const double xt = sb * (h + n * d / t) + tokens * (h + F / etp) + (shared > 0 ? sb * (h + shared / t) : 0.0);
      bytes += xt * (c.precision.fp8_recipe == "blockwise" ? 1.0 + 4.0 / 128.0 : 1.0);
    }
    return bytes;
  }
  if (c.precision.fp8_format && fp8_wgrad) bytes += sb * (2 * h + n * d / t + F / t);  // FP8: the four GEMM inputs' transposes (1 byte)
  if (c.precision.fp8_format && c.precision.fp8_recipe == "blockwise") bytes += sb * (2 * h + n * d / t + F / t) * 4.0 / 128.0;  // their block scales
  return bytes;
}

// Bytes per token of one microbatch's working buffers, which the CUDA engine keeps once (not per microbatch in
// flight): the gradients a layer's backward passes through (residual stream, norms, attention, MLP), the QKV
// and block outputs of the forward, the final norm's output, and FP8's and MoE's copies.
double working_bytes_per_token(const Config& c) {
  const RankShape shape(c);
  const double h = shape.h, n = shape.n, d = shape.d, g = shape.g, t = shape.t, r = shape.rep, a = shape.a, res = shape.res;
  const bool sp = shape.sp;
  const double Hd = n * d / t, KVd = std::max(1.0, g / t) * d, Wq = Hd + 2 * KVd;
  const double F = static_cast<double>(c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(h), c.model.swiglu))) / t;
  const double F1 = gated_mlp(c.model) ? 2 * F : F;
  double bytes = a * Wq + a * h + a * h;       // the QKV output, a block's output, the final norm's output
  bytes += res * h / r + 8.0 / r + 4.0;        // the final norm's input and statistics, the losses
  bytes += 4.0 * h / r + a * h / r + a * h;    // the residual stream's gradient (fp32 and 16-bit), a norm's output gradient
  bytes += a * (2 * Hd + 2 * KVd);             // the attention's output and input gradients
  bytes += a * (F + F1);                       // the MLP's activation and fc1 gradients
  if (sp || res != 4.0) bytes += 4.0 * h;      // the embedding's fp32 sum (and SP's gradient gather)
  if (sp) bytes += 3.0 * a * h / r + 2.0 * a * h;  // SP's local rows and gathers
  if (c.precision.fp8_format) bytes += std::max({h, Hd, F, Wq, F1}) + std::max({Wq, h, F1});  // an FP8 operand, dy^T (1 byte each)
  if (c.moe.num_experts) {  // the experts' gradients for top-k copies of each token, the router's
    const double k = static_cast<double>(c.moe.moe_router_topk), rows = expert_rows_per_token(c);
    const double Fm = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F * t)));
    const double etp = static_cast<double>(c.parallel.expert_tensor_parallel_size.value_or(c.parallel.tensor_model_parallel_size));
    bytes += a * rows * (2 * h + (gated_mlp(c.model) ? 3.0 : 2.0) * Fm / etp) + 4.0 * 2.0 * static_cast<double>(*c.moe.num_experts) + 4.0 * k;
    const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0)) / t;
    bytes += a * shared * (gated_mlp(c.model) ? 3.0 : 1.0);  // the shared expert's activation and fc1 gradients
    if (c.precision.fp8_format) {  // the FP8 experts' operand and dy^T, each expert's rows or the shared expert's
      const double widest = std::max({h, (gated_mlp(c.model) ? 2.0 : 1.0) * Fm / etp, (gated_mlp(c.model) ? 2.0 : 1.0) * shared});
      bytes += 2.0 * std::max(rows, 1.0) * widest;
    }
  }
  if (const double cp = static_cast<double>(c.parallel.context_parallel_size); cp > 1) {
    // The CUDA engine's context-parallel attention scratch (model/cuda/gpt_cuda_context.cpp): the ring's fp32 output and
    // dQ accumulators, two K/V blocks in flight and two of their fp32 gradients, one block's 16-bit output and
    // gradients and its log-sum-exp; or the all-to-all's Q, K, V, O, dO, dQ, dK, dV and two staging buffers (with
    // documents, every rank's document starts twice).
    if (c.parallel.cp_comm_type == "a2a") {
      bytes += a * (6 * Hd + 4 * KVd) + (c.data.reset_attention_mask ? 8.0 * cp : 0.0);
    } else {
      bytes += 8.0 * Hd + 2 * a * 2 * KVd + 2 * 4.0 * 2 * KVd + a * (2 * Hd + 2 * KVd) + 4.0 * n / t;
    }
  }
  return bytes;
}

}  // namespace

int64_t output_layer_chunk_rows(int64_t vocab_local, int64_t tokens) {
  constexpr int64_t kLogitsChunkBytes = 512ll << 20;
  const int64_t rows = std::max<int64_t>(64, kLogitsChunkBytes / (2 * std::max<int64_t>(1, vocab_local)) / 64 * 64);
  return std::min(tokens, rows);
}

MemoryEstimate estimate_memory_for_stage(const Config& c, int64_t stage) {
  MemoryEstimate m;
  m.stage = stage;
  const RankParams rp = params_on_rank(c, stage);
  m.params = rp.total();
  const bool half = half_precision(c);
  const double wbytes = half ? 2.0 : 4.0;
  const bool adam = c.training.optimizer == "adam";
  // fp32 master weights and Adam's moments (each 2 bytes where --exp-avg-dtype / --exp-avg-sq-dtype is bf16)
  const double opt_bytes = (half ? 4.0 : 0.0) + (exp_avg_in_bf16(c) ? 2.0 : 4.0) + (adam ? (exp_avg_sq_in_bf16(c) ? 2.0 : 4.0) : 0.0);
  // (the dense state sharded over one instance's ranks: DP x CP / --num-distributed-optimizer-instances)
  const double dp_cp = static_cast<double>(c.derived.data_parallel_size * c.parallel.context_parallel_size) /
                       static_cast<double>(std::max<int64_t>(1, c.training.num_distributed_optimizer_instances));
  const double edp = static_cast<double>(c.derived.expert_data_parallel_size) /
                     static_cast<double>(std::max<int64_t>(1, c.training.num_distributed_optimizer_instances));  // (likewise the experts')
  m.weights = wbytes * static_cast<double>(m.params);
  m.grads = 4.0 * static_cast<double>(m.params);
  m.optimizer_unsharded = opt_bytes * static_cast<double>(m.params);
  m.optimizer_sharded = opt_bytes * (static_cast<double>(rp.dense) / dp_cp + static_cast<double>(rp.expert) / edp);
  m.optimizer = c.training.use_distributed_optimizer ? m.optimizer_sharded : m.optimizer_unsharded;
  if (c.training.optimizer_cpu_offload) m.optimizer *= 1.0 - c.training.optimizer_offload_fraction;

  // Activations of the microbatches in flight under the configured schedule (1F1B: stage p holds
  // min(PP - p, microbatches)), counted from the schedule's own list.
  const int64_t pp = c.parallel.pipeline_model_parallel_size;
  m.in_flight_microbatches = configured_in_flight(c, stage);

  const auto stages = layers_per_pipeline_stage(c);
  int64_t first_layer = 0;
  for (int64_t st = 0; st < stage; ++st) first_layer += stages[static_cast<size_t>(st)];
  const int64_t nlayers = stages[static_cast<size_t>(stage)];
  const std::string gran = c.recompute.recompute_granularity.value_or("");
  const std::string method = c.recompute.recompute_method.value_or("");
  const int64_t k = c.recompute.recompute_num_layers.value_or(1);
  double per_mb = 0, shared_dense = 0, shared_moe = 0, shared_expert_act = 0, shared_mla = 0;
  const std::vector<bool> pattern = moe_layer_pattern(c);
  for (int64_t i = 0; i < nlayers; ++i) {
    const int64_t l = first_layer + i;
    const bool moe = pattern[static_cast<size_t>(l)];
    bool full = false;
    if (gran == "full") full = method == "uniform" || (method == "block" && i < k);
    // (selective recompute of mlp / moe: the layers' MLP blocks share one set of buffers, a dense layer's and an MoE
    // layer's side by side, once per model chunk)
    const bool mlp_recompute = c.recompute.recomputes(moe ? "moe" : "mlp");
    if (mlp_recompute) (moe ? shared_moe : shared_dense) = mlp_block_bytes(c, moe, true);
    const bool act_shared = moe && !full && expert_activation_shared(c, l, mlp_recompute);
    if (act_shared) shared_expert_act = expert_activation_bytes(c);
    if (!full && mla_up_shared(c)) {  // (the up projections' outputs every such layer shares)
      shared_mla = mla_up_bytes(c, static_cast<double>(c.training.micro_batch_size.value_or(1)) * static_cast<double>(c.data.seq_length.value_or(0)) /
                                       static_cast<double>(c.parallel.context_parallel_size));
    }
    per_mb += layer_activation_bytes(c, moe, full, mlp_recompute, act_shared);
  }
  // Multi-token prediction's modules on the last stage: each a layer of the last layer's kind, with its input projection's
  // and norms' buffers (four [s b, h] and one [s b, 2h]).
  if (stage == pp - 1 && !pattern.empty()) {
    const bool moe = pattern.back();
    const double sbh = static_cast<double>(c.training.micro_batch_size.value_or(1)) * static_cast<double>(c.data.seq_length.value_or(0)) *
                       static_cast<double>(c.model.hidden_size.value_or(0)) / static_cast<double>(c.parallel.context_parallel_size) /
                       RankShape(c).rep;  // (this rank's tokens under SP)
    for (int64_t k = 0; k < c.model.mtp_num_layers.value_or(0); ++k) {
      per_mb += layer_activation_bytes(c, moe, false, c.recompute.recomputes(moe ? "moe" : "mlp")) + (half ? 2.0 : 4.0) * 6.0 * sbh;
    }
  }
  if (gran == "full" && method == "uniform") {
    // Uniform keeps only each chunk's input, plus one chunk's activations during its recompute.
    per_mb = per_mb / static_cast<double>(std::max<int64_t>(1, k)) +
             static_cast<double>(std::min(k, nlayers)) * layer_activation_bytes(c, false, false, false);
  }
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double s = static_cast<double>(c.data.seq_length.value_or(0)) / static_cast<double>(c.parallel.context_parallel_size);
  const double h = static_cast<double>(c.model.hidden_size.value_or(0));
  const double t = static_cast<double>(c.parallel.tensor_model_parallel_size);
  const double a = half ? 2.0 : 4.0;
  if (stage == 0) per_mb += a * s * b * h + 8.0 * s * b;  // embedding output + token ids
  m.activations_per_microbatch = per_mb;
  m.activations = per_mb * m.in_flight_microbatches +
                  (shared_dense + shared_moe + shared_expert_act + shared_mla) * static_cast<double>(std::max<int64_t>(1, virtual_stages_per_rank(c)));
  const auto tokens = static_cast<int64_t>(s * b);
  if (stage == pp - 1) {
    // One chunk of rows of bf16 logits at a time (the loss gradient written over them), then the labels' losses.
    const auto vocab_local = static_cast<int64_t>(static_cast<double>(c.derived.padded_vocab_size) / t);
    m.logits = a * static_cast<double>(output_layer_chunk_rows(vocab_local, tokens) * vocab_local);
  }
  m.working = working_bytes_per_token(c) * static_cast<double>(tokens);
  if (stage == pp - 1 && m.in_flight_microbatches > 1) {  // the CUDA engine keeps the final norm's buffers per microbatch in flight
    const RankShape shape(c);
    m.working += (m.in_flight_microbatches - 1) * static_cast<double>(tokens) * (shape.res * h / shape.rep + a * h + 8.0 / shape.rep);
  }
  if (c.precision.fp8_format) {  // the CUDA engine's FP8 copies of each FP8 layer's linear weights, W and W^T (1 byte each)
    const RankShape shape(c);
    const double Hd = shape.n * shape.d / t, Wq = Hd + 2 * std::max(1.0, shape.g / t) * shape.d;
    const double F = static_cast<double>(c.model.ffn_hidden_size.value_or(default_ffn_hidden_size(static_cast<int64_t>(h), c.model.swiglu))) / t;
    const double mlp_width = gated_mlp(c.model) ? 3.0 : 2.0;  // fc1's outputs and fc2's input per unit of F
    const double per_layer = 2.0 * h * (Wq + Hd + mlp_width * F);
    // An MoE layer: the attention's, every local expert's (fc1 and fc2 at expert-TP) and the shared expert's.
    double per_moe_layer = 0;
    if (c.moe.num_experts) {
      const double Fm = static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F * t)));
      const double etp = static_cast<double>(c.derived.expert_tensor_parallel_size);
      const double local = static_cast<double>(*c.moe.num_experts / std::max<int64_t>(1, c.parallel.expert_model_parallel_size));
      const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0)) / t;
      per_moe_layer = 2.0 * h * (Wq + Hd + mlp_width * (local * Fm / etp + shared));
    }
    const auto& pr = c.precision;
    const int64_t L = c.model.num_layers.value_or(0);
    for (int64_t i = 0; i < nlayers; ++i) {
      const int64_t l = first_layer + i;
      if (!pr.first_last_layers_bf16 || (l >= pr.num_layers_at_start_in_bf16 && l < L - pr.num_layers_at_end_in_bf16)) {
        m.working += pattern[static_cast<size_t>(l)] ? per_moe_layer : per_layer;
      }
    }
  }
  if (c.data.reset_attention_mask) {
    // The CUDA engine's document-mask bias [b, 1, S, S], 16-bit, over the whole sequences; the ring (context
    // parallelism, p2p) builds one block's [b, 2c, 2c] instead.
    const double cp = static_cast<double>(c.parallel.context_parallel_size), whole = s * cp;
    m.working += cp > 1 && c.parallel.cp_comm_type == "p2p" ? 2.0 * b * s * s : 2.0 * b * whole * whole;
  }
  m.overhead = c.derived.world_size > 1 ? kOverheadNccl : kOverheadOneGpu;
  m.total = m.weights + m.grads + m.optimizer + m.activations + m.logits + m.working + m.overhead;
  return m;
}

MemoryEstimate estimate_memory(const Config& c) {
  MemoryEstimate best;
  for (int64_t st = 0; st < c.parallel.pipeline_model_parallel_size; ++st) {
    MemoryEstimate m = estimate_memory_for_stage(c, st);
    if (st == 0 || m.total > best.total) best = m;
  }
  return best;
}

MegatronTheoretical megatron_theoretical_memory(const Config& c) {
  MegatronTheoretical out;
  const double h = static_cast<double>(c.model.hidden_size.value_or(0));
  const double n = static_cast<double>(c.model.num_attention_heads.value_or(1));
  const double kv = static_cast<double>(c.model.kv_channels.value_or(static_cast<int64_t>(h / n)));
  const double groups = c.model.group_query_attention ? static_cast<double>(c.model.num_query_groups) : n;
  const double qratio = kv * n / h;
  const double E = static_cast<double>(c.moe.num_experts.value_or(1));
  const double gate = c.model.swiglu ? 1.5 : 1.0;  // (Megatron's formula checks --swiglu only)
  const double shared = static_cast<double>(c.moe.moe_shared_expert_intermediate_size.value_or(0));
  const double F = static_cast<double>(c.model.ffn_hidden_size.value_or(0));
  const double Fmoe = c.moe.num_experts ? static_cast<double>(c.moe.moe_ffn_hidden_size.value_or(static_cast<int64_t>(F))) : 0.0;
  const double norm = c.model.normalization == "RMSNorm" ? 1.0 : 2.0;
  const int64_t L = c.model.num_layers.value_or(0);
  double n_moe = 0;
  if (c.moe.num_experts) {
    for (bool m : moe_layer_pattern(c)) n_moe += m ? 1 : 0;
  }
  const double n_dense = static_cast<double>(L) - n_moe;
  double attn = 2.0 * h * h * (1.0 + groups / n) * qratio;
  if (c.model.multi_latent_attention) {  // (Megatron's MLA term: the projections, the latents' norms)
    const ModelConfig& m = c.model;
    const double dn = static_cast<double>(m.qk_head_dim), dr = static_cast<double>(m.qk_pos_emb_head_dim), dv = static_cast<double>(m.v_head_dim);
    const double Rkv = static_cast<double>(m.kv_lora_rank);
    const double q_term = m.q_lora_rank ? static_cast<double>(*m.q_lora_rank) * (h + n * (dn + dr) + norm) : h * n * (dn + dr);
    attn = q_term + Rkv * (h + n * (dn + dv) + norm) + h * dr + n * dv * h;
  }
  const double dense_layer = 2.0 * h * (F * gate + norm) + attn;
  const double moe_layer = 2.0 * h * (Fmoe * E * gate + shared * gate + norm) + attn;
  const double V = static_cast<double>(c.derived.padded_vocab_size);
  const double emb = h * V;
  const double tp = static_cast<double>(c.parallel.tensor_model_parallel_size);
  const double pp = static_cast<double>(c.parallel.pipeline_model_parallel_size);
  const double block = dense_layer * n_dense + moe_layer * n_moe + norm * h;
  double most_loaded = (block / pp + emb) / tp;
  if (c.model.untie_embeddings_and_output_weights && pp == 1) most_loaded += emb / tp;
  const double dp = static_cast<double>(c.derived.data_parallel_size);
  const double bytes_per_param = c.training.use_distributed_optimizer ? 6.0 + 12.0 / dp : 18.0;
  out.weights_and_optimizer = most_loaded * bytes_per_param;

  const double s = static_cast<double>(c.data.seq_length.value_or(0));
  const double b = static_cast<double>(c.training.micro_batch_size.value_or(1));
  const double nmb = static_cast<double>(c.derived.num_microbatches);
  const bool sp_selective = c.parallel.sequence_parallel && c.recompute.recompute_granularity.value_or("") == "selective";
  const int64_t vpp = virtual_stages_per_rank(c);
  double act;
  if (sp_selective) {
    act = s * b * h * (18.0 + 4.0 * F / h) * static_cast<double>(L);
  } else {
    act = s * b * h * (10.0 + 24.0 / tp) * static_cast<double>(L);
  }
  act += 8.0 * s * b * pp + s * b * h * pp;
  if (vpp > 1) {
    act *= 1.0 + (pp - 1.0) / (pp * static_cast<double>(vpp));
  } else if (pp > 1) {
    act *= std::min(1.0, nmb / pp);
  }
  if (pp == 1) {
    act += sp_selective ? s * b * h * 4.0 * (1.0 + V / h) : (s * b * V / tp + s * b * h) * 2.0;
  }
  // The SP variant's per-layer term is per full TP group; the other already divides by TP inside.
  if (sp_selective) act /= tp; else act *= 1.05;
  out.activations = act;
  return out;
}

}  // namespace mt
