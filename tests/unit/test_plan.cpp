// test_plan.cpp: parameter counts of published models, Megatron's FLOP formula, the memory model.
#include <cmath>
#include <utility>

#include "catch.h"
#include "config/resolve.h"
#include "config/yaml_io.h"
#include "plan/flops.h"
#include "plan/cp_traffic.h"
#include "plan/memory_model.h"
#include "plan/moe_traffic.h"
#include "plan/param_count.h"
#include "plan/pipeline_plan.h"

using namespace mt;

namespace {
Config recipe(const std::string& name, int64_t world) {
  Config c;
  apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/" + name + ".yaml");
  resolve(c, world, c.model.vocab_size ? 0 : 50257);
  return c;
}
}  // namespace

TEST_CASE("parameter counts of published models") {
  // GPT-2 124M with vocab padded to 50304 and 1024 positions.
  CHECK(count_params(recipe("gpt2-124m", 1)).total == 124475904);
  // Meta's LLaMA-3 8B: 8,030,261,248.
  Config l8 = recipe("llama3-8b", 2);
  CHECK(count_params(l8).total == 8030261248);
  // Mixtral 8x7B: 46.7B total, 12.9B active.
  const ParamCounts mx = count_params(recipe("mixtral-8x7b", 32));
  CHECK(mx.total == 46702792704);
  // Active: all but 6 of the 8 experts in each of the 32 layers (3 x 4096 x 14336 each).
  CHECK(mx.active == mx.total - 32LL * 6 * 3 * 4096 * 14336);
  // Qwen3-8B (8.19B; 6.95B without the embeddings and output layer) and Qwen3-30B-A3B (30.5B, 3.3B active; 29.9B
  // without them): head dimension 128 (--kv-channels) and the QK norms' two [128] weights per layer counted.
  // (at TP 1: under the recipe's TP 2 Megatron pads the 151,936 rows to a multiple of 256, 152,064)
  Config qwen8;
  apply_yaml_file(qwen8, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/qwen3-8b.yaml");
  qwen8.parallel.tensor_model_parallel_size = 1;
  qwen8.parallel.sequence_parallel = false;
  resolve(qwen8, 1);
  const ParamCounts q8 = count_params(qwen8);
  CHECK(q8.total == 8190735360);
  CHECK(q8.total - 2LL * 151936 * 4096 == 6946075648);
  CHECK(count_params(recipe("qwen3-8b", 2)).total == 8190735360 + 2LL * 128 * 4096);
  const ParamCounts q30 = count_params(recipe("qwen3-30b-a3b", 8));
  CHECK(q30.total == 30532122624);
  CHECK(q30.active == 3353032704);  // 8 of the 128 experts in each of the 48 layers
  CHECK(q30.total - q30.active == 48LL * 120 * 3 * 2048 * 768);
  // GPT-OSS 20B: 20,914,757,184 (HF's GptOssForCausalLM: biases in every linear layer, the router's too, 64 sinks a layer,
  // 32 experts of 2880 x 5760 + 2880 x 2880 with biases; vocab 201,088 untied); 4 of the 32 experts active.
  const ParamCounts oss = count_params(recipe("gpt-oss-20b", 16));
  CHECK(oss.total == 20914757184);
  CHECK(oss.total - oss.active == 24LL * 28 * (2880 * 5760 + 5760 + 2880 * 2880 + 2880));
}

TEST_CASE("parameter counts: Qwen2.5-0.5B's QKV biases (--add-qkv-bias)") {
  // Qwen2.5-0.5B: 24 layers, h 896, 14 heads, 2 KV groups, ffn 4864, vocab 151,936, tied; biases on Q, K and V only:
  // 494,032,768 parameters.
  Config c;
  c.model.num_layers = 24;
  c.model.hidden_size = 896;
  c.model.num_attention_heads = 14;
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  c.model.ffn_hidden_size = 4864;
  c.model.swiglu = true;
  c.model.normalization = "RMSNorm";
  c.model.position_embedding_type = "rope";
  c.model.disable_bias_linear = true;
  c.model.add_qkv_bias = true;
  c.model.vocab_size = 151936;
  c.data.seq_length = 4096;
  c.model.max_position_embeddings = 4096;
  resolve(c, 1);
  CHECK(count_params(c).total == 494032768);
  c.model.add_qkv_bias = false;
  CHECK(count_params(c).total == 494032768 - 24 * (896 + 2 * 128));
}

TEST_CASE("parameters per rank add up to the model") {
  Config c = recipe("llama3-70b", 16);  // TP4 PP4 DP1
  int64_t sum = 0;
  for (int64_t st = 0; st < 4; ++st) sum += params_on_rank(c, st).total() * 4;  // x TP
  const ParamCounts p = count_params(c);
  // Norms are replicated over TP, so the per-rank sum exceeds the total by 3 copies of them.
  const int64_t norms = 80 * 2 * 8192 + 8192;
  CHECK(sum == p.total + 3 * norms);
}

TEST_CASE("FLOPs follow Megatron's formula") {
  Config c = recipe("bench/gpt2-124m", 1);
  const double T = 64.0 * 1024, h = 768, F = 3072, L = 12, V = 50304, s = 1024, n = 12, d = 64, g = 12;
  const double expect = T * (6 * h * 2 * F * L + 6 * L * (h * (n * d + 2 * g * d) + n * d * h) + 6 * h * V) + T * s * 6 * n * d * L;
  CHECK(flops_per_iteration(c) == Approx(expect).epsilon(1e-12));
  CHECK(peak_tflops_for_gpu("NVIDIA H200") == 989.4);
  CHECK(peak_tflops_for_gpu("NVIDIA A100-SXM4-80GB") == 312);
  CHECK(peak_tflops_for_gpu("Some CPU") == 0);
}

TEST_CASE("memory model: LLaMA-3 70B on 64 GPUs against Megatron's formula") {
  Config c = recipe("llama3-70b", 64);
  CHECK(c.derived.data_parallel_size == 4);
  const MemoryEstimate m = estimate_memory(c);
  const MegatronTheoretical mg = megatron_theoretical_memory(c);
  // Weights + grads + optimizer: ours and Megatron's agree within 5% (both 6 + 12/DP bytes per param).
  CHECK((m.weights + m.grads + m.optimizer) == Approx(mg.weights_and_optimizer).epsilon(0.05));
  // Activations (selective recompute, SP, flash attention): within 15%.
  CHECK(m.activations == Approx(mg.activations).epsilon(0.15));
  CHECK(m.in_flight_microbatches == 4);
  // The distributed optimizer shards the 12 bytes of state over DP.
  CHECK(m.optimizer_sharded == Approx(m.optimizer_unsharded / 4).epsilon(0.01));
}

TEST_CASE("memory model: selective recompute of the MoE blocks keeps one layer's MLP buffers") {
  Config c = recipe("mixtral-8x7b", 32);  // (full recompute in the recipe)
  c.recompute.recompute_granularity.reset();
  c.recompute.recompute_method.reset();
  c.recompute.recompute_num_layers.reset();
  const MemoryEstimate none = estimate_memory(c);
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"core_attn", "moe"};
  const MemoryEstimate moe = estimate_memory(c);
  c.recompute.recompute_modules = {"core_attn", "mlp"};  // (mlp: dense layers only; Mixtral has none)
  const MemoryEstimate mlp = estimate_memory(c);
  INFO("activations: none " << none.activations << ", moe " << moe.activations << ", mlp " << mlp.activations);
  CHECK(mlp.activations == Approx(none.activations));
  // Under EP 4 the experts' rows, fc1 outputs and activations stay in each layer's growing buffers: less is saved.
  CHECK(moe.activations < none.activations);
  // Without EP the experts' buffers, which dominate a Mixtral layer's, are shared: well under half is kept.
  Config one = c;
  one.parallel.expert_model_parallel_size = 1;
  one.recompute.recompute_modules = {"core_attn", "moe"};
  resolve(one, 32);
  const double moe_no_ep = estimate_memory(one).activations;
  one.recompute.recompute_granularity.reset();
  const double none_no_ep = estimate_memory(one).activations;
  INFO("without EP: none " << none_no_ep << ", moe " << moe_no_ep);
  CHECK(moe_no_ep < none_no_ep / 2);
  CHECK(none.activations - moe.activations < none_no_ep - moe_no_ep);
  c.recompute.recompute_granularity = "full";
  c.recompute.recompute_method = "uniform";
  c.recompute.recompute_num_layers = 1;
  CHECK(estimate_memory(c).activations < moe.activations);
}

TEST_CASE("memory model: moe_act keeps one layer's experts' activations, as FP8 MoE layers do") {
  Config c = recipe("mixtral-8x7b", 32);
  c.recompute.recompute_granularity.reset();
  c.recompute.recompute_method.reset();
  c.recompute.recompute_num_layers.reset();
  c.parallel.expert_model_parallel_size = 1;
  c.parallel.pipeline_model_parallel_size = 1;
  resolve(c, 32);
  const MemoryEstimate none = estimate_memory(c);
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"core_attn", "moe_act"};
  const MemoryEstimate act = estimate_memory(c);
  // Each layer's routed experts' activations: tokens x top-2 rows of moe-ffn 14336 bf16 values (expert-TP = TP 2, SP).
  const double tokens = static_cast<double>(*c.training.micro_batch_size * *c.data.seq_length);
  const double one_layer = 2.0 * tokens * 2 * 14336 / 2;
  const double layers = static_cast<double>(*c.model.num_layers);
  INFO("none " << none.activations << ", moe_act " << act.activations << ", one layer's experts' activations " << one_layer);
  CHECK(none.activations - act.activations == Approx((layers - 1) * one_layer).epsilon(1e-9));
  CHECK(act.activations - act.activations_per_microbatch * act.in_flight_microbatches == Approx(one_layer).epsilon(1e-9));
  // FP8 layers read none of them in the backward: shared without moe_act too (and moe_act changes nothing there).
  c.precision.fp8_format = "hybrid";
  c.precision.fp8_recipe = "tensorwise";
  const double fp8_act = estimate_memory(c).activations;
  c.recompute.recompute_granularity.reset();
  CHECK(estimate_memory(c).activations == Approx(fp8_act));
  // With the first layer in bf16, moe_act recomputes that one's too.
  c.precision.first_last_layers_bf16 = true;
  c.precision.num_layers_at_start_in_bf16 = 1;
  c.precision.num_layers_at_end_in_bf16 = 0;
  const double fp8_first_bf16 = estimate_memory(c).activations;
  c.recompute.recompute_granularity = "selective";
  CHECK(fp8_first_bf16 - estimate_memory(c).activations == Approx(one_layer + 15.0 * 8 * 14336 * 2 / 2).epsilon(1e-9));
}

TEST_CASE("memory model: recompute lowers activations, layers change nothing else") {
  Config c = recipe("llama3-8b", 8);
  const double sel = estimate_memory(c).activations;
  c.recompute.recompute_granularity = "full";
  c.recompute.recompute_method = "uniform";
  c.recompute.recompute_num_layers = 1;
  const double full = estimate_memory(c).activations;
  CHECK(full < sel / 4);
  c.recompute.recompute_granularity.reset();
  c.recompute.recompute_method.reset();
  const double none = estimate_memory(c).activations;
  CHECK(none >= sel);
}

TEST_CASE("parameters per rank with K/V replication match the model's shard") {
  // LLaMA-3 8B layout on TP 16: 8 query groups, so each group's QKV block lives on two ranks.
  Config c = recipe("llama3-8b", 16);
  c.parallel.tensor_model_parallel_size = 16;
  c.parallel.pipeline_model_parallel_size = 1;
  resolve(c, 16);
  const int64_t h = 4096, d = 128, layers = 32, V = c.derived.padded_vocab_size;
  const int64_t qkv = (32 / 8 + 2) * d * h;                           // the group's 4 query heads + K + V
  const int64_t per_layer = qkv + (32 * d / 16) * h + 3 * (14336 / 16) * h + 2 * h;  // + proj, MLP, norms
  CHECK(params_on_rank(c, 0).total() == layers * per_layer + 2 * (V / 16) * h + h);
}

TEST_CASE("MoE FLOPs follow Megatron's formula (routed top-k, shared experts, the layer pattern; no router term)") {
  Config c = recipe("mixtral-8x7b", 32);
  c.moe.moe_layer_freq = "[0]+[1]*31";
  c.moe.moe_shared_expert_intermediate_size = 2048;
  resolve(c, 32);
  const double T = 256.0 * 4096, h = 4096, F = 14336, L = 32, V = 32000, s = 4096, n = 32, d = 128, g = 8, k = 2, shared = 2048;
  // Megatron's transformer_flops: 12 L h (ffn g (dense/L) + moe_ffn k g (moe/L) + shared g (moe/L)), g = 3/2 with SwiGLU.
  const double mlp = 12 * L * h * (F * 1.5 * (1 / L) + F * k * 1.5 * (31 / L) + shared * 1.5 * (31 / L));
  const double expect = T * (mlp + 6 * L * (h * (n * d + 2 * g * d) + n * d * h) + 6 * h * V) + T * s * 6 * n * d * L;
  CHECK(flops_per_iteration(c) == Approx(expect).epsilon(1e-12));
}

TEST_CASE("plan: the MoE dispatcher's and context parallelism's traffic per GPU") {
  Config c = recipe("mixtral-8x7b", 32);  // TP 2 (SP) x EP 4, micro batch 1, seq 4096, bf16, full recompute
  const MoeTraffic m = moe_traffic(c, 8);
  const double tokens = 4096.0 / 2, h = 4096, k = 2, ep = 4;
  CHECK(m.ep_bytes == Approx(tokens * k * (ep - 1) / ep * h * 2));
  CHECK(m.etp_bytes == Approx(1 * tokens * k * h * 2));  // expert-TP 2: the rows to the other rank
  CHECK(m.exchanges == 6);
  CHECK(m.moe_layers == 32);
  CHECK(m.step_bytes == Approx((m.ep_bytes + m.etp_bytes) * 6 * 32 * c.derived.num_microbatches));
  CHECK_FALSE(m.inter_node);  // ETP 2 x EP 4 = 8 GPUs: one node
  Config l = recipe("llama3-8b", 8);
  l.parallel.context_parallel_size = 4;
  l.parallel.tensor_model_parallel_size = 2;
  resolve(l, 8);
  const CpTraffic t = cp_traffic(l, 8, 400.0);
  const double b = static_cast<double>(*l.training.micro_batch_size), s = static_cast<double>(*l.data.seq_length);
  const double block = 2.0 * b * s / 4 * (8.0 / 2) * 128 * 2;  // K and V: 8 query groups / TP 2, head dim 128, bf16
  CHECK(t.block_bytes == Approx(block));
  const bool full = l.recompute.recompute_granularity.value_or("") == "full";
  CHECK(t.layer_bytes == Approx(3 * block * (full ? 2 : 1) + 4 * 2 * block));
  CHECK(t.compute_seconds > 0);
  Config none = recipe("llama3-8b", 8);
  CHECK(cp_traffic(none, 8, 400.0).step_bytes == 0);
}

TEST_CASE("memory model: the output layer's chunk of logits and the plan against the CUDA engine's measured peaks") {
  CHECK(output_layer_chunk_rows(128384, 16384) == 2048);  // 512 MiB of bf16 logits, multiples of 64 rows
  CHECK(output_layer_chunk_rows(50304, 65536) == 5312);
  CHECK(output_layer_chunk_rows(50304, 1000) == 1000);    // never more than the microbatch
  CHECK(output_layer_chunk_rows(8000000, 4096) == 64);    // at least 64 rows
  // The device memory the CUDA engine's process used (its "peak GPU memory" at iteration 10, one H200, 2026-12-02,
  // docs/memory-model.md): the plan stays within 10% of each.
  const std::pair<const char*, double> measured_gib[] = {
      {"bench/gpt2-124m", 23.29}, {"bench/gpt2-1.5b", 65.85}, {"bench/llama-1.5b", 46.54}, {"bench/llama3-8b-shape", 77.06}, {"bench/moe-3.9b", 92.98}};
  for (const auto& [name, gib] : measured_gib) {
    const double planned = estimate_memory(recipe(name, 1)).total / (1024.0 * 1024.0 * 1024.0);
    INFO(name << ": plan " << planned << " GiB, measured " << gib << " GiB");
    CHECK(std::abs(planned - gib) <= 0.10 * gib);
  }
  // FP8 in the MoE layers (the experts' x^T, FP8 weights and scratch; 2026-12-04, device peak): 104.37 GiB tensorwise and
  // delayed on b43fa90; 106.13 GiB blockwise on 5939e81, whose MoE records still held two unused dense x^T buffers (about
  // 1.5 GiB, dropped since, as tensorwise's fall from 105.87 measured). Delayed scaling's records have held no 16-bit
  // expert activation since (4.02 GiB less, predicted 100.35 GiB; the plan says 99.04): not yet measured.
  for (const auto& [fp8_recipe, gib] :
       {std::pair<const char*, double>{"tensorwise", 104.37}, {"delayed", 104.37}, {"blockwise", 106.13}}) {
    Config c = recipe("bench/moe-3.9b", 1);
    c.precision.fp8_format = "hybrid";
    c.precision.fp8_recipe = fp8_recipe;
    const double planned = estimate_memory(c).total / (1024.0 * 1024.0 * 1024.0);
    INFO("moe-3.9b FP8 " << fp8_recipe << ": plan " << planned << " GiB, measured " << gib << " GiB");
    CHECK(std::abs(planned - gib) <= 0.10 * gib);
    CHECK(planned > estimate_memory(recipe("bench/moe-3.9b", 1)).total / (1024.0 * 1024.0 * 1024.0) + 5.0);  // (the FP8 copies counted)
  }
}

TEST_CASE("pipeline plan: interleaved groups of microbatches and an explicit layout, simulated as configured") {
  auto config = [](int64_t layers, int64_t pp, int64_t microbatches, auto&& change) {
    Config c;
    c.model.num_layers = layers;
    c.model.hidden_size = 64;
    c.model.num_attention_heads = 4;
    c.model.vocab_size = 1000;
    c.data.seq_length = 32;
    c.training.micro_batch_size = 1;
    c.training.global_batch_size = microbatches;
    c.parallel.pipeline_model_parallel_size = pp;
    change(c);
    resolve(c, pp);
    return c;
  };
  auto configured = [](const Config& c) {
    const std::vector<ScheduleEstimate> all = pipeline_schedule_estimates(c);
    REQUIRE(!all.empty());
    REQUIRE(all.front().chosen);
    return all.front();
  };
  // Megatron's example, 5 microbatches in groups of 3 on 2 stages of 2 chunks: runnable, simulated.
  const Config example = config(8, 2, 5, [](Config& c) {
    c.parallel.num_virtual_stages_per_pipeline_rank = 2;
    c.parallel.microbatch_group_size_per_vp_stage = 3;
  });
  CHECK(configured(example).unavailable.empty());
  CHECK(configured(example).chunks == 2);
  CHECK(configured_in_flight(example, 0) > 0);
  // Past the simulated count (1,200 microbatches in groups of 6): the simulated counts keep whole groups.
  const Config many = config(8, 4, 1200, [](Config& c) {
    c.parallel.num_virtual_stages_per_pipeline_rank = 2;
    c.parallel.microbatch_group_size_per_vp_stage = 6;
  });
  CHECK(configured(many).unavailable.empty());
  CHECK(configured(many).bubble > 0);
  CHECK(configured_in_flight(many, 0) > 0);
  // A group size without interleaving is ignored (as Megatron), also by the estimate of two chunks.
  const Config plain = config(8, 2, 4, [](Config& c) { c.parallel.microbatch_group_size_per_vp_stage = 6; });
  CHECK_NOTHROW(pipeline_schedule_estimates(plain));
  // An explicit layout: its own chunks' layers (rank 0 holds 3 + 2), not an even split.
  const Config layout = config(15, 4, 8, [](Config& c) { c.parallel.pipeline_model_parallel_layout = "Et*3|(tt|)*6L"; });
  CHECK(configured(layout).unavailable.empty());
  CHECK(configured(layout).bubble > 0);
  // Multi-token prediction's modules weigh on the loss's stage: a layout that moves a layer off it for them
  // ("...|tmmL" holds one t fewer there than "...|ttL" would) idles less than one that leaves it loaded.
  const Config light = config(4, 2, 8, [](Config& c) {
    c.model.mtp_num_layers = 2;
    c.parallel.pipeline_model_parallel_layout = "Ettt|tmmL";
  });
  const Config heavy = config(4, 2, 8, [](Config& c) {
    c.model.mtp_num_layers = 2;
    c.parallel.pipeline_model_parallel_layout = "Et|tttmmL";
  });
  CHECK(configured(light).bubble < configured(heavy).bubble);
  const Config without = config(4, 2, 8, [](Config& c) { c.parallel.pipeline_model_parallel_layout = "Et|tttL"; });
  CHECK(configured(heavy).bubble > configured(without).bubble);
}
