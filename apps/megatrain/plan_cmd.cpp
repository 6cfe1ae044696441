// plan_cmd.cpp: `megatrain plan`: factorisation, process groups, parameters, memory per GPU, FLOPs
// and time per iteration for a world size, without any GPU.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "config/errors.h"
#include "config/moe_pattern.h"
#include "config/yaml_io.h"
#include "config_setup.h"
#include "parallel/launcher.h"
#include "parallel/rank_layout.h"
#include "pipeline/configured_schedule.h"
#include "plan/flops.h"
#include "plan/cp_traffic.h"
#include "plan/memory_model.h"
#include "plan/moe_traffic.h"
#include "plan/param_count.h"
#include "plan/pipeline_plan.h"

namespace mt {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

std::string human(double v) {
  char buf[32];
  if (v >= 1e12) std::snprintf(buf, sizeof(buf), "%.2fT", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof(buf), "%.2fB", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof(buf), "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof(buf), "%.1fK", v / 1e3);
  else std::snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

std::string list(const std::vector<int64_t>& v) {
  std::string s = "[";
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 8 && i == 4) {
      s += " ...";
      i = n - 3;
      continue;
    }
    s += (i ? " " : "") + std::to_string(v[i]);
  }
  return s + "]";
}

void print_groups(const RankLayout& layout, bool moe) {
  const int64_t world = layout.world_size();
  std::printf("\nprocess groups (rank: coordinates; group members)%s\n", world > 16 ? ", first 8 and last 4 ranks" : "");
  for (int64_t r = 0; r < world; ++r) {
    if (world > 16 && r == 8) {
      std::printf("  ...\n");
      r = world - 4;
    }
    const RankCoords c = layout.coords(r);
    const RankGroups g = layout.groups(r);
    std::printf("  rank %3lld: tp %lld cp %lld dp %lld pp %lld | TP %s PP %s DP %s DPxCP %s", static_cast<long long>(r),
                static_cast<long long>(c.tp), static_cast<long long>(c.cp), static_cast<long long>(c.dp),
                static_cast<long long>(c.pp), list(g.tp).c_str(), list(g.pp).c_str(), list(g.dp).c_str(),
                list(g.dp_cp).c_str());
    if (layout.sizes().cp > 1) std::printf(" CP %s", list(g.cp).c_str());
    if (moe) {
      std::printf(" | ep %lld EP %s ETP %s EDP %s", static_cast<long long>(c.ep), list(g.ep).c_str(),
                  list(g.expert_tp).c_str(), list(g.expert_dp).c_str());
    }
    if (!g.embedding.empty()) std::printf(" | EMB %s", list(g.embedding).c_str());
    std::printf("\n");
  }
}

}  // namespace

int run_plan(int argc, char** argv) {
  CLI::App app{"megatrain plan: check a parallel layout and estimate memory and time per GPU (no GPU needed)",
               "megatrain plan"};
  ConfigCli cli(app);
  int64_t world = 0;
  int64_t gpus_per_node = 8;
  double gpu_memory_gb = 80.0;
  double gpu_tflops = 400.0;
  double peak_tflops = 989.4;
  bool show_groups = true;
  app.add_option("--world-size", world, "Number of GPUs (default: the launcher's world size)")->group("Plan");
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs per node (default 8)")->group("Plan");
  app.add_option("--gpu-memory-gb", gpu_memory_gb, "Memory per GPU in GiB (default 80: H100; H200 has 141)")->group("Plan");
  app.add_option("--gpu-tflops", gpu_tflops, "Achieved TFLOP/s per GPU assumed for the time estimate (default 400)")
      ->group("Plan");
  app.add_option("--peak-tflops", peak_tflops, "Peak dense TFLOP/s per GPU for MFU (default 989.4: H100/H200 bf16)")
      ->group("Plan");
  app.add_flag("--groups,!--no-groups", show_groups, "Print the process-group table (default on)")->group("Plan");

  // The world size is needed before validation: peek at it the same way CLI11 will parse it.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--world-size" && i + 1 < argc) world = std::strtoll(argv[i + 1], nullptr, 10);
    else if (a.rfind("--world-size=", 0) == 0) world = std::strtoll(a.c_str() + 13, nullptr, 10);
  }
  if (world == 0) world = detect_launch().world_size;
  Config cfg = setup_config(app, cli, argc, argv, world, Purpose::kPlan, true);
  if (gpus_per_node < 1) throw ConfigError("--gpus-per-node must be >= 1, got " + std::to_string(gpus_per_node));
  if (cli.print_config()) {
    std::cout << config_to_yaml(cfg);
    return 0;
  }
  if (cfg.derived.padded_vocab_size == 0) {
    throw ConfigError("plan needs the vocabulary size: add --vocab-size (e.g. 128256 for LLaMA-3), --tokenizer-type GPT2BPETokenizer, or HuggingFaceTokenizer / Llama2Tokenizer with --tokenizer-model");
  }
  const auto& p = cfg.parallel;
  const auto& d = cfg.derived;
  const bool moe = cfg.moe.num_experts.has_value();
  const RankLayout layout = RankLayout::from_config(cfg, world);

  int64_t moe_layers = 0;
  if (moe) {
    for (bool m : moe_layer_pattern(cfg)) moe_layers += m ? 1 : 0;
  }
  // (a model whose every layer is an MoE layer has no dense MLP: its --ffn-hidden-size is not used)
  const std::string ffn = moe_layers == *cfg.model.num_layers ? std::string("MLP") : "ffn " + std::to_string(*cfg.model.ffn_hidden_size);
  std::printf("megatrain plan\n");
  const std::string heads = cfg.model.multi_latent_attention ? std::string("multi-latent")
                                                               : std::to_string(d.num_query_groups) + " query groups, head dim " +
                                                                     std::to_string(*cfg.model.kv_channels);
  std::printf("model: %lld layers, hidden %lld, %lld heads (%s), %s%s, %s, %s, vocab %lld (padded %lld), seq %lld\n",
              static_cast<long long>(*cfg.model.num_layers), static_cast<long long>(*cfg.model.hidden_size),
              static_cast<long long>(*cfg.model.num_attention_heads), heads.c_str(), ffn.c_str(),
              cfg.model.swiglu ? " SwiGLU" : " GELU", cfg.model.normalization.c_str(),
              cfg.model.position_embedding_type.c_str(), static_cast<long long>(d.vocab_size),
              static_cast<long long>(d.padded_vocab_size), static_cast<long long>(*cfg.data.seq_length));
  if (cfg.model.multi_latent_attention) {  // (the heads above: the query / key width without RoPE is --qk-head-dim)
    const ModelConfig& m = cfg.model;
    std::printf("attention: multi-latent, query latent %s, key/value latent %lld, heads %lld + %lld RoPE (shared by the keys) wide, values %lld, "
                "RoPE %s\n",
                m.q_lora_rank ? std::to_string(*m.q_lora_rank).c_str() : "none", static_cast<long long>(m.kv_lora_rank),
                static_cast<long long>(m.qk_head_dim), static_cast<long long>(m.qk_pos_emb_head_dim), static_cast<long long>(m.v_head_dim),
                m.rope_type.value_or("yarn").c_str());
  }
  if (cfg.model.mtp_num_layers) {  // (docs/mtp.md)
    std::printf("multi-token prediction: %lld module(s) on the last stage, each a layer of the last layer's kind, losses x %g / %lld\n",
                static_cast<long long>(*cfg.model.mtp_num_layers), cfg.model.mtp_loss_scaling_factor,
                static_cast<long long>(*cfg.model.mtp_num_layers));
  }
  if (moe) {
    std::printf("moe: %lld experts, top-%lld, expert ffn %lld, %lld of %lld layers MoE (--moe-layer-freq %s)\n",
                static_cast<long long>(*cfg.moe.num_experts), static_cast<long long>(cfg.moe.moe_router_topk),
                static_cast<long long>(cfg.moe.moe_ffn_hidden_size.value_or(0)), static_cast<long long>(moe_layers),
                static_cast<long long>(*cfg.model.num_layers), cfg.moe.moe_layer_freq.c_str());
  }
  std::printf("\nlayout: world size %lld = TP %lld x PP %lld x CP %lld x DP %lld (rank order %s)\n",
              static_cast<long long>(world), static_cast<long long>(p.tensor_model_parallel_size),
              static_cast<long long>(p.pipeline_model_parallel_size), static_cast<long long>(p.context_parallel_size),
              static_cast<long long>(d.data_parallel_size), layout.order().c_str());
  if (moe || p.expert_model_parallel_size > 1) {
    std::printf("expert grid: ETP %lld x EP %lld x expert-DP %lld x PP %lld\n", static_cast<long long>(d.expert_tensor_parallel_size),
                static_cast<long long>(p.expert_model_parallel_size), static_cast<long long>(d.expert_data_parallel_size),
                static_cast<long long>(p.pipeline_model_parallel_size));
  }
  std::printf("nodes: %lld x %lld GPUs%s\n", static_cast<long long>((world + gpus_per_node - 1) / gpus_per_node),
              static_cast<long long>(gpus_per_node),
              p.tensor_model_parallel_size > gpus_per_node ? "  (warning: TP spans nodes; keep TP within a node)" : "");
  std::printf("batch: global %lld = micro %lld x DP %lld x %lld microbatches\n", static_cast<long long>(d.global_batch_size),
              static_cast<long long>(*cfg.training.micro_batch_size), static_cast<long long>(d.data_parallel_size),
              static_cast<long long>(d.num_microbatches));
  std::string stages;
  for (auto n : d.layers_per_stage) stages += (stages.empty() ? "" : " ") + std::to_string(n);
  std::printf("layers per pipeline stage: %s\n", stages.c_str());
  if (show_groups) print_groups(layout, moe || p.expert_model_parallel_size > 1);

  const ParamCounts pc = count_params(cfg);
  const MemoryEstimate mem = estimate_memory(cfg);
  std::printf("\nparameters: %s total", human(static_cast<double>(pc.total)).c_str());
  if (moe) std::printf(", %s active per token", human(static_cast<double>(pc.active)).c_str());
  std::printf("; %s on the most loaded rank (stage %lld)\n", human(static_cast<double>(mem.params)).c_str(),
              static_cast<long long>(mem.stage));

  const bool half = cfg.precision.bf16 || cfg.precision.fp16;
  std::printf("\nmemory per GPU, most loaded rank (pipeline stage %lld), %s:\n", static_cast<long long>(mem.stage),
              half ? "bf16/fp16 weights, fp32 grads and master weights" : "fp32");
  std::printf("  weights                 %s\n", gib(mem.weights).c_str());
  std::printf("  gradients (fp32)        %s\n", gib(mem.grads).c_str());
  std::printf("  optimizer state         %s   (without distributed optimizer %s, with it %s)%s\n", gib(mem.optimizer).c_str(),
              gib(mem.optimizer_unsharded).c_str(), gib(mem.optimizer_sharded).c_str(),
              cfg.training.optimizer_cpu_offload
                  ? (" [" + std::to_string(static_cast<int>(std::lround(100 * cfg.training.optimizer_offload_fraction))) + "% offloaded: " +
                     gib((cfg.training.use_distributed_optimizer ? mem.optimizer_sharded : mem.optimizer_unsharded) * cfg.training.optimizer_offload_fraction) + " in host memory]").c_str()
                  : "");
  std::string recompute = cfg.recompute.recompute_granularity.value_or("none");
  if (recompute == "selective") {  // (the modules)
    recompute += " of";
    for (const std::string& module : cfg.recompute.recompute_modules) recompute += " " + module;
  }
  // (beside the microbatches': mlp / moe, one layer's MLP buffers; moe_act and FP8 MoE layers, one layer's experts' activations;
  // mla_up_proj, one layer's MLA up projections' outputs)
  const double shared = mem.activations - mem.activations_per_microbatch * mem.in_flight_microbatches;
  if (shared > 0) {
    const bool mlp = cfg.recompute.recomputes("mlp") || cfg.recompute.recomputes("moe");
    const bool experts = cfg.moe.num_experts.has_value() && (cfg.recompute.recomputes("moe_act") || cfg.precision.fp8_format.has_value());
    const bool mla = cfg.model.multi_latent_attention && cfg.recompute.recomputes("mla_up_proj");
    recompute += ", + " + gib(shared) + " of " +
                 (mlp && !experts && !mla ? "MLP buffers shared by the recomputed layers"
                  : experts && !mlp && !mla ? "the experts' activations the layers share"
                  : mla && !mlp && !experts ? "MLA up projections' outputs shared by the recomputed layers"
                                            : "buffers shared by the recomputed layers");
  }
  std::printf("  activations             %s   (%s per microbatch x %g in flight under %s, recompute %s)\n",
              gib(mem.activations).c_str(), gib(mem.activations_per_microbatch).c_str(), mem.in_flight_microbatches,
              schedule_name(cfg).c_str(), recompute.c_str());
  std::printf("  logits and loss         %s   (the output layer's rows in chunks)\n", gib(mem.logits).c_str());
  std::printf("  working buffers         %s   (one microbatch's gradients through a layer)\n", gib(mem.working).c_str());
  std::printf("  runtime overhead        %s   (CUDA context, workspaces, NCCL)\n", gib(mem.overhead).c_str());
  std::printf("  total                   %s of %.0f GiB\n", gib(mem.total).c_str(), gpu_memory_gb);
  const MegatronTheoretical mt_mem = megatron_theoretical_memory(cfg);
  std::printf("  Megatron's theoretical formula: weights+optimizer %s, activations %s\n", gib(mt_mem.weights_and_optimizer).c_str(),
              gib(mt_mem.activations).c_str());
  const double limit = gpu_memory_gb * 1024.0 * 1024.0 * 1024.0;
  bool fits = mem.total <= limit;
  if (!fits) {
    std::string fixes;
    if (!cfg.training.use_distributed_optimizer && d.data_parallel_size > 1) fixes += "--use-distributed-optimizer, ";
    if (cfg.recompute.recompute_granularity.value_or("") != "full") fixes += "--recompute-granularity full, ";
    fixes += "a larger TP or PP, or a smaller --micro-batch-size";
    std::printf("\nWARNING: this layout does not fit: %s needed per GPU, %.0f GiB available (--gpu-memory-gb). Try %s.\n",
                gib(mem.total).c_str(), gpu_memory_gb, fixes.c_str());
  }

  const double flops = flops_per_iteration(cfg);
  const double tokens = static_cast<double>(d.global_batch_size) * static_cast<double>(*cfg.data.seq_length);
  const double compute_s = flops / (static_cast<double>(world) * gpu_tflops * 1e12);
  // The pipeline's idle fraction, from a run of the schedules' own lists (plan/pipeline_plan.h).
  const std::vector<ScheduleEstimate> schedules = pipeline_schedule_estimates(cfg);
  const double bubble = schedules.empty() ? 0.0 : schedules.front().bubble;
  const double iter_s = compute_s / (1.0 - bubble);
  if (!schedules.empty()) {
    std::printf("\npipeline schedules (%lld microbatches; simulated from the schedules' lists, F = B = W per layer):\n",
                static_cast<long long>(d.num_microbatches));
    for (const ScheduleEstimate& e : schedules) {
      if (!e.unavailable.empty()) {
        std::printf("  %-28s %s\n", e.name.c_str(), ("not available: " + e.unavailable).c_str());
        continue;
      }
      std::string held;
      for (const int64_t n : e.in_flight) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(n) / static_cast<double>(e.chunks));
        held += (held.empty() ? "" : " ") + std::string(buf);
      }
      std::printf("  %-28s bubble %5.1f%%   microbatches in flight per stage: %s%s\n", e.name.c_str(), 100.0 * e.bubble, held.c_str(),
                  e.chosen ? "   <- configured" : "");
    }
  }
  std::printf("\ncompute per iteration: %.3e FLOPs (%s tokens)\n", flops, human(tokens).c_str());
  std::printf("estimated time per iteration: %.3f s at %.0f TFLOP/s per GPU, pipeline bubble %.1f%%\n", iter_s, gpu_tflops, 100.0 * bubble);
  std::printf("estimated throughput: %.0f tokens/s/GPU, MFU %.1f%% of %.1f TFLOP/s\n", tokens / iter_s / static_cast<double>(world),
              100.0 * flops / (iter_s * static_cast<double>(world) * peak_tflops * 1e12), peak_tflops);
  if (cfg.parallel.context_parallel_size > 1) {
    const CpTraffic ct = cp_traffic(cfg, gpus_per_node, gpu_tflops);
    std::printf("\ncontext parallelism (%s over CP %lld; each rank %lld tokens of each sequence), per GPU:\n", cfg.parallel.cp_comm_type.c_str(),
                static_cast<long long>(cfg.parallel.context_parallel_size),
                static_cast<long long>(*cfg.data.seq_length / cfg.parallel.context_parallel_size));
    std::printf("  per layer and microbatch: %.1f MiB (forward%s and backward); per iteration %s, %.3f s at %.0f GB/s (%s, assumed)\n",
                ct.layer_bytes / 1048576.0, cfg.recompute.recompute_granularity.value_or("") == "full" ? ", recompute" : "",
                gib(ct.step_bytes).c_str(), ct.seconds, ct.gbps, ct.inter_node ? "across nodes" : "NVLink");
    if (cfg.parallel.cp_comm_type == "p2p") {
      std::printf("  a ring step: a %.1f MiB K/V block in %.3f ms beside %.3f ms of block attention at %.0f TFLOP/s: %s\n", ct.block_bytes / 1048576.0,
                  1e3 * ct.block_seconds, 1e3 * ct.compute_seconds, gpu_tflops,
                  ct.block_seconds <= ct.compute_seconds ? "hidden" : "NOT hidden (longer sequences per rank, fewer CP ranks, or a2a)");
    }
  }
  if (cfg.moe.num_experts) {
    const MoeTraffic tr = moe_traffic(cfg, gpus_per_node);
    std::printf("\ntoken dispatch (%s over EP %lld, expert-TP %lld), per GPU, uniform routing assumed:\n", cfg.moe.moe_token_dispatcher_type.c_str(),
                static_cast<long long>(cfg.parallel.expert_model_parallel_size), static_cast<long long>(d.expert_tensor_parallel_size));
    std::printf("  per MoE layer and microbatch, each way: %.1f MiB over EP + %.1f MiB over expert-TP\n", tr.ep_bytes / 1048576.0,
                tr.etp_bytes / 1048576.0);
    std::printf("  per iteration: %s (%lld MoE layers x %lld microbatches x %lld exchanges: dispatch and combine, forward and backward%s)\n",
                gib(tr.step_bytes).c_str(), static_cast<long long>(tr.moe_layers), static_cast<long long>(d.num_microbatches),
                static_cast<long long>(tr.exchanges), tr.exchanges > 4 ? ", recompute" : "");
    std::printf("  at %.0f GB/s (%s, assumed): %.3f s, %.0f%% of the iteration's compute%s\n", tr.gbps, tr.inter_node ? "across nodes" : "NVLink",
                tr.seconds, 100.0 * tr.seconds / std::max(1e-12, iter_s),
                tr.seconds > 0.5 * iter_s ? " (it will not hide behind the experts' GEMMs: a smaller EP or more tokens per microbatch)" : "");
  }
  return 0;
}

}  // namespace mt
