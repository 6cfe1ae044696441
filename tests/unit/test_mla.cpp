// test_mla.cpp: multi-latent attention's configuration (Megatron's rules for --multi-latent-attention and what megatrain
// leaves out), its FLOPs and parameter counts (Megatron's formulas; DeepSeek-V3's published size), and the CUDA engine's
// refusal by name. Its arithmetic: test_model_grad.cpp's gradient checks, the parity layouts (tests/CMakeLists.txt's mla_*)
// and HF's DeepseekV3ForCausalLM in tests/interop.
#include <algorithm>
#include <cmath>
#include <string>

#include "catch.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/yaml_io.h"
#include "plan/flops.h"
#include "plan/memory_model.h"
#include "plan/param_count.h"
#include "tensor/device_info.h"
#include "train/capabilities.h"

using namespace mt;

namespace {

Config mla() {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = 32;
  c.model.position_embedding_type = "rope";
  c.model.normalization = "RMSNorm";
  c.model.swiglu = true;
  c.model.multi_latent_attention = true;
  c.model.q_lora_rank = 24;
  c.model.kv_lora_rank = 16;
  c.model.qk_head_dim = 16;
  c.model.qk_pos_emb_head_dim = 8;
  c.model.v_head_dim = 12;
  c.model.qk_layernorm = true;
  c.model.disable_bias_linear = true;
  c.data.seq_length = 32;
  c.data.mock_data = true;
  c.training.micro_batch_size = 2;
  c.training.train_iters = 10;
  c.training.lr = 1e-3;
  return c;
}

std::string errors(const Config& c, int64_t world = 1) {
  std::string all;
  for (const auto& e : validate(c, world, Purpose::kTrain).errors) all += e + "\n";
  return all;
}

}  // namespace

TEST_CASE("--multi-latent-attention: Megatron's rules") {
  CHECK(errors(mla()).empty());
  Config c = mla();
  c.model.group_query_attention = true;
  c.model.num_query_groups = 2;
  CHECK_THAT(errors(c), MT_CONTAINS("--multi-latent-attention and --group-query-attention cannot be combined"));
  // (MLA rotates its own part whatever the model's position embedding, as Megatron's: learned positions or none beside it;
  // yarn would hand MLA the model's rotary embedding, which Megatron's MLA refuses)
  for (const char* beside : {"learned_absolute", "none"}) {
    c = mla();
    c.model.position_embedding_type = beside;
    INFO(beside);
    CHECK(errors(c).empty());
  }
  c = mla();
  c.model.position_embedding_type = "yarn";
  CHECK_THAT(errors(c), MT_CONTAINS("give --position-embedding-type rope, learned_absolute or none, not yarn"));
  c = mla();
  c.model.rotary_interleaved = true;
  CHECK_THAT(errors(c), MT_CONTAINS("--rotary-interleaved does not work with --multi-latent-attention"));
  c = mla();
  c.model.cache_mla_latents = true;
  CHECK_THAT(errors(c), MT_CONTAINS("--cache-mla-latents is for inference"));
  c = mla();
  c.model.q_lora_rank.reset();  // (Megatron would norm the hidden state again before the query projection)
  CHECK_THAT(errors(c), MT_CONTAINS("--qk-layernorm with --multi-latent-attention and no --q-lora-rank is not implemented"));
  c.model.qk_layernorm = false;
  CHECK(errors(c).empty());
  c = mla();
  c.model.qk_pos_emb_head_dim = 7;
  CHECK_THAT(errors(c), MT_CONTAINS("--qk-pos-emb-head-dim must be even"));
  c = mla();
  c.model.rope_type = "none";
  CHECK_THAT(errors(c), MT_CONTAINS("--rope-type must be rope or yarn"));
  c = mla();
  c.precision.fp8_format = "hybrid";
  c.precision.bf16 = true;
  CHECK_THAT(errors(c), MT_CONTAINS("FP8 with --multi-latent-attention is not implemented"));
  c = mla();
  c.model.multi_latent_attention = false;  // (--rope-type yarn picks MLA's RoPE only; --mla-down-proj-fusion needs MLA)
  c.model.rope_type = "yarn";
  c.model.mla_down_proj_fusion = true;
  CHECK_THAT(errors(c), MT_CONTAINS("--rope-type yarn picks multi-latent attention's RoPE"));
  CHECK_THAT(errors(c), MT_CONTAINS("--mla-down-proj-fusion needs --multi-latent-attention"));
  c = mla();  // (selective recompute's mla_up_proj: with MLA)
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"mla_up_proj"};
  CHECK(errors(c).empty());
}

TEST_CASE("--multi-latent-attention: Megatron's FLOPs, the parameters, DeepSeek-V3's size") {
  Config c = mla();
  resolve(c, 1, 256);
  // Megatron's MLA terms per token and layer: 6 (q_term + Rkv (h + n (dn + dv) + 1) + h dr + n dv h), q_term Rq (h + n (dn + dr) + 1);
  // the core attention 3 n (dn + dr + dv) s
  const double h = 64, n = 4, Rq = 24, Rkv = 16, dn = 16, dr = 8, dv = 12, s = 32, V = 256, F = *c.model.ffn_hidden_size;
  const double attention = 6 * (Rq * (h + n * (dn + dr) + 1) + Rkv * (h + n * (dn + dv) + 1) + h * dr + n * dv * h);
  const double per_token = 6 * h * 3 * F * 2 + 2 * attention + 6 * h * V + s * 3 * n * (dn + dr + dv) * 2;
  CHECK(flops_for_tokens(c, 10) == Approx(10 * per_token).epsilon(1e-12));
  // Parameters: the latents' projections and norms, the heads' up projections, the output projection
  const int64_t attn = 24 * 64 + 24 + 4 * 24 * 24 + (16 + 8) * 64 + 16 + 4 * 28 * 16 + 64 * 4 * 12 + 64;
  CHECK(count_params(c).dense_layer == attn + 64 + 3 * 64 * F);
  // DeepSeek-V3: 671,026,404,352 parameters without its 14,848 e_score_correction_bias entries (not trained) and its MTP module
  Config ds;
  apply_yaml_file(ds, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/deepseek-v3.yaml");
  resolve(ds, 1024, 0);
  INFO(errors(ds, 1024));
  CHECK(errors(ds, 1024).empty());
  // (the recipe's multi-token-prediction module beside: its norms and projection 3 h + 2 h^2, and an MoE layer)
  const ParamCounts with_mtp = count_params(ds);
  CHECK(with_mtp.mtp_module == 3 * 7168 + 2 * 7168LL * 7168);
  CHECK(with_mtp.total == 671026404352 + with_mtp.mtp_module + with_mtp.moe_layer);
  ds.model.mtp_num_layers.reset();
  CHECK(count_params(ds).total == 671026404352);
  // The CUDA engine: on one rank and under TP; refused by name under CP (a build without CUDA says so instead)
  for (const int64_t tp : {1, 2}) {
    Config layout = mla();
    layout.parallel.tensor_model_parallel_size = tp;
    resolve(layout, static_cast<int>(tp), 256);
    std::string gaps;
    for (const auto& g : cuda_engine_gaps(layout, static_cast<int>(tp))) gaps += g + "\n";
    if (built_with_cuda()) CHECK(gaps.find("multi-latent") == std::string::npos);
  }
  // (learned positions beside MLA on the CUDA engine: refused by name until its GPU case has run)
  Config learned = mla();
  learned.model.position_embedding_type = "learned_absolute";
  resolve(learned, 1, 256);
  std::string learned_gaps;
  for (const auto& g : cuda_engine_gaps(learned, 1)) learned_gaps += g + "\n";
  CHECK_THAT(learned_gaps, MT_CONTAINS(!built_with_cuda() ? "this build has no CUDA backend"
                                                          : "--multi-latent-attention with --position-embedding-type learned_absolute has not run on a GPU yet"));
  Config split = mla();
  split.parallel.context_parallel_size = 2;
  resolve(split, 2, 256);
  std::string gaps;
  for (const auto& g : cuda_engine_gaps(split, 2)) gaps += g + "\n";
  CHECK_THAT(gaps, MT_CONTAINS(!built_with_cuda() ? "this build has no CUDA backend"
                                                  : "--multi-latent-attention with --context-parallel-size > 1 is not implemented on the CUDA engine"));
}

TEST_CASE("--multi-latent-attention: the memory plan, with --recompute-modules mla_up_proj") {
  // Per layer and token (bf16, one TP rank): the latents before their norms (24 + 16), the output (4 x 12) and its statistics
  // (4 fp32); the up projections' outputs: queries and keys 2 x 4 x 24, values 4 x 12, the normed latents 24 + 16 and their
  // norms' statistics (2 x 8 bytes). With mla_up_proj a layer keeps its rotated k_pe (8) instead, and one set is shared.
  Config c = mla();
  c.precision.bf16 = true;
  c.training.micro_batch_size = 2;
  c.data.seq_length = 32;
  resolve(c, 1, 256);
  const double tokens = 64, up = 2.0 * (2 * 4 * 24 + 4 * 12 + 24 + 16) + 16, k_pe = 2.0 * 8;
  const MemoryEstimate plain = estimate_memory_for_stage(c, 0);
  c.recompute.recompute_granularity = "selective";
  c.recompute.recompute_modules = {"mla_up_proj"};
  const MemoryEstimate recomputed = estimate_memory_for_stage(c, 0);
  CHECK(plain.activations - recomputed.activations == Approx(tokens * (2 * up - up - 2 * k_pe)));
  CHECK(recomputed.activations - recomputed.activations_per_microbatch == Approx(tokens * up));
  // The CUDA engine runs it (another module of Megatron's stays refused by name)
  std::string gaps;
  for (const auto& g : cuda_engine_gaps(c, 1)) gaps += g + "\n";
  if (built_with_cuda()) CHECK(gaps.find("mla_up_proj") == std::string::npos);
  c.recompute.recompute_modules = {"mla_up_proj", "layernorm"};
  gaps.clear();
  for (const auto& g : unsupported_features(c, 1, true)) gaps += g + "\n";
  CHECK_THAT(gaps, MT_CONTAINS("--recompute-modules layernorm is not implemented"));
  CHECK(gaps.find("--recompute-modules mla_up_proj") == std::string::npos);
}
