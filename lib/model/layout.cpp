// layout.cpp: the parameters of one stage's shard, registered in Megatron's order: embedding (first stage),
// per layer input norm, QKV, --qk-layernorm's norms, projection, pre-MLP norm, fc1, fc2, then the final norm
// and the output layer (last stage). The order fixes the flat offsets, so the data-parallel buckets and the
// checkpoints of a one-stage model are what they were before the layout was shared.
#include "model/layout.h"

#include <array>
#include <cmath>
#include <string>

#include "config/errors.h"
#include "config/moe_pattern.h"
#include "config/resolve.h"
#include "model/model_dims.h"

namespace mt {
namespace {

ParamInfo make_param(const std::string& name, std::vector<int64_t> global, int shard_dim, int64_t rank, int64_t count,
                     InitKind init, float std) {
  ParamInfo p;
  p.name = name;
  p.global_shape = global;
  p.local_shape = global;
  if (shard_dim >= 0 && count > 1) p.local_shape[static_cast<size_t>(shard_dim)] /= count;
  p.shard_dim = shard_dim;
  p.shard_rank = rank;
  p.shard_count = count;
  p.init = init;
  p.init_std = std;
  p.weight_decay = global.size() > 1;  // Megatron: no decay on biases and norm weights
  return p;
}

}  // namespace

LayerRange stage_layers(const Config& cfg, int64_t pp_rank, int64_t pp_size, int64_t chunk) {
  const int64_t L = *cfg.model.num_layers;
  if (pp_size < 1 || pp_rank < 0 || pp_rank >= pp_size) throw std::logic_error("stage_layers: pipeline rank out of range");
  if (pp_size == cfg.parallel.pipeline_model_parallel_size && pp_size > 1) {
    // The configured split over the virtual stages (validated): even, uneven first / last stages, the
    // embedding and loss counted as layers, each rank's layers over its chunks.
    const std::vector<int64_t> per = layers_per_virtual_stage(cfg);
    const int64_t vs = chunk * pp_size + pp_rank;
    if (chunk < 0 || vs >= static_cast<int64_t>(per.size())) throw std::logic_error("stage_layers: model chunk out of range");
    int64_t first = 0, total = 0;
    for (size_t v = 0; v < per.size(); ++v) {
      if (static_cast<int64_t>(v) < vs) first += per[v];
      total += per[v];
    }
    if (total != L) throw ConfigError("the pipeline stages hold " + std::to_string(total) + " layers, not --num-layers " + std::to_string(L));
    return {first, first + per[static_cast<size_t>(vs)]};
  }
  if (chunk != 0) throw std::logic_error("stage_layers: model chunks without the configured pipeline");
  if (L % pp_size != 0) {
    throw ConfigError("--num-layers " + std::to_string(L) + " is not divisible by --pipeline-model-parallel-size " + std::to_string(pp_size) +
                      ": choose a layer count that is a multiple of the pipeline size");
  }
  const int64_t per = L / pp_size;
  return {pp_rank * per, (pp_rank + 1) * per};
}

namespace {

// Registers the parameters of chunk `chunk` of `chunks` of the stage after those already in the store (no
// memory yet).
ModelLayout register_model_params(const Config& cfg, const LayoutCoordinates& at, ParamStore& store, int64_t chunk, int64_t chunks) {
  const ModelDims D = model_dims(cfg, at.tp_rank, at.tp_size, at.ep_rank, at.ep_size, at.etp_rank, at.etp_size);
  const std::vector<bool> moe_layers = moe_layer_pattern(cfg);
  const float std = static_cast<float>(cfg.model.init_method_std);
  const float out_std = std / std::sqrt(2.0f * static_cast<float>(D.L));
  const int64_t r = D.tp_rank, t = D.tp;
  ModelLayout M;
  M.ep_rank = at.ep_rank;
  M.ep_size = at.ep_size;
  M.etp_rank = at.etp_rank;
  M.etp_size = at.etp_size;
  M.layers_range = stage_layers(cfg, at.pp_rank, at.pp_size, chunk);
  M.pre_process = at.pp_rank == 0 && chunk == 0;
  M.post_process = at.pp_rank == at.pp_size - 1 && chunk == chunks - 1;
  auto put = [&](ParamInfo p) {
    p.chunk = chunk;
    return store.add(std::move(p));
  };
  const InitKind norm_init = D.norm_1p ? InitKind::kZeros : InitKind::kOnes;  // (--apply-layernorm-1p: 1 + weight)
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int shard_dim, InitKind init, float sd) {
    return put(make_param(name, std::move(shape), shard_dim, r, t, init, sd));
  };
  // K/V replication (query groups below TP, as Megatron): the QKV weight is split into whole groups over the
  // ng groups of kv_rep ranks each; ranks of a group hold the same shard (replica > 0 for all but one).
  auto add_qkv = [&](const std::string& name, std::vector<int64_t> shape, InitKind init, float sd) {
    ParamInfo p = make_param(name, std::move(shape), 0, r / D.kv_rep, t / D.kv_rep, init, sd);
    p.replica = r % D.kv_rep;
    return put(p);
  };
  if (M.pre_process) {
    M.word_embeddings = add("embedding.word_embeddings.weight", {D.V, D.h}, 0, InitKind::kNormal, std);
    if (D.learned_pos) M.position_embeddings = add("embedding.position_embeddings.weight", {D.max_pos, D.h}, -1, InitKind::kNormal, std);
    M.embedding_end = store.size();
  }
  const int64_t qkv_rows = D.ng * (D.nh / D.ng + 2) * D.d;
  // A transformer layer's parameters, named from `p` (global layer l; an MoE layer where `moe`).
  auto add_layer = [&](int64_t l, const std::string& p, bool moe) {
    LayerParams ly;
    ly.layer = l;
    ly.first = store.size();
    ly.input_norm_w = add(p + "input_norm.weight", {D.h}, -1, norm_init, 0);
    if (!D.rms) ly.input_norm_b = add(p + "input_norm.bias", {D.h}, -1, InitKind::kZeros, 0);
    if (D.mla) {  // (Megatron's names: linear_q_proj, linear_q_down_proj, q_layernorm, linear_q_up_proj, linear_kv_down_proj, ...)
      const int64_t q_rows = D.nh * D.d, kv_rows = D.nh * (D.qk_nope + D.v_dim);
      if (D.q_lora_rank == 0) {
        ly.q_proj_w = add(p + "attention.q_proj.weight", {q_rows, D.h}, 0, InitKind::kNormal, std);
      } else {
        ly.q_down_w = add(p + "attention.q_down_proj.weight", {D.q_lora_rank, D.h}, -1, InitKind::kNormal, std);
        if (D.qk_norm) {
          ly.q_latent_norm_w = add(p + "attention.q_layernorm.weight", {D.q_lora_rank}, -1, norm_init, 0);
          if (!D.rms) ly.q_latent_norm_b = add(p + "attention.q_layernorm.bias", {D.q_lora_rank}, -1, InitKind::kZeros, 0);
        }
        ly.q_up_w = add(p + "attention.q_up_proj.weight", {q_rows, D.q_lora_rank}, 0, InitKind::kNormal, std);
      }
      ly.kv_down_w = add(p + "attention.kv_down_proj.weight", {D.kv_lora_rank + D.qk_rope, D.h}, -1, InitKind::kNormal, std);
      if (D.qk_norm) {
        ly.kv_latent_norm_w = add(p + "attention.kv_layernorm.weight", {D.kv_lora_rank}, -1, norm_init, 0);
        if (!D.rms) ly.kv_latent_norm_b = add(p + "attention.kv_layernorm.bias", {D.kv_lora_rank}, -1, InitKind::kZeros, 0);
      }
      ly.kv_up_w = add(p + "attention.kv_up_proj.weight", {kv_rows, D.kv_lora_rank}, 0, InitKind::kNormal, std);
    } else {
      ly.qkv_w = add_qkv(p + "attention.qkv.weight", {qkv_rows, D.h}, InitKind::kNormal, std);
      if (D.qkv_bias) ly.qkv_b = add_qkv(p + "attention.qkv.bias", {qkv_rows}, InitKind::kZeros, 0);
    }
    if (D.qk_norm && !D.mla) {  // one [d] weight shared by every query head (and one by every key head), on every TP rank
      // (--apply-wd-to-qk-layernorm: Megatron's Qwen3-Next rule, these norms' weights and biases decayed)
      auto add_qk_norm = [&](const std::string& name, InitKind init) {
        ParamInfo n = make_param(name, {D.d}, -1, r, t, init, 0);
        n.weight_decay = cfg.training.apply_wd_to_qk_layernorm;
        return put(n);
      };
      ly.q_norm_w = add_qk_norm(p + "attention.q_norm.weight", norm_init);
      if (!D.rms) ly.q_norm_b = add_qk_norm(p + "attention.q_norm.bias", InitKind::kZeros);
      ly.k_norm_w = add_qk_norm(p + "attention.k_norm.weight", norm_init);
      if (!D.rms) ly.k_norm_b = add_qk_norm(p + "attention.k_norm.bias", InitKind::kZeros);
    }
    // (Megatron: initialised by init_method, normal with --init-method-std; no weight decay, as every 1-D parameter)
    if (D.sink == ModelDims::Sink::kLearnable) ly.softmax_offset = add(p + "attention.softmax_offset", {D.nh}, 0, InitKind::kNormal, std);
    ly.proj_w = add(p + "attention.proj.weight", {D.h, D.nh * (D.mla ? D.v_dim : D.d)}, 1, InitKind::kNormal, out_std);
    if (D.bias) ly.proj_b = add(p + "attention.proj.bias", {D.h}, -1, InitKind::kZeros, 0);
    ly.mlp_norm_w = add(p + "mlp_norm.weight", {D.h}, -1, norm_init, 0);
    if (!D.rms) ly.mlp_norm_b = add(p + "mlp_norm.bias", {D.h}, -1, InitKind::kZeros, 0);
    // An MLP of width F (global) at `prefix`, sliced `count` ways (slice `rank`); returns fc1_w, fc1_b, fc2_w, fc2_b.
    // With SwiGLU the gate and up projections are separate global tensors whose shards sit side by side, so
    // the local fc1 is one [2F/count, h] GEMM.
    auto add_mlp = [&](const std::string& prefix, int64_t F, int64_t rank, int64_t count, GradGroup group) {
      auto mlp_param = [&](const std::string& name, std::vector<int64_t> shape, int shard_dim, InitKind init, float sd) {
        ParamInfo info = make_param(prefix + name, std::move(shape), shard_dim, rank, count, init, sd);
        info.grad_group = group;
        return put(info);
      };
      std::array<size_t, 4> out{kNoParam, kNoParam, kNoParam, kNoParam};
      if (D.swiglu) {
        out[0] = mlp_param("fc1_gate.weight", {F, D.h}, 0, InitKind::kNormal, std);
        mlp_param("fc1_up.weight", {F, D.h}, 0, InitKind::kNormal, std);
        if (D.bias) {
          out[1] = mlp_param("fc1_gate.bias", {F}, 0, InitKind::kZeros, 0);
          mlp_param("fc1_up.bias", {F}, 0, InitKind::kZeros, 0);
        }
      } else {
        out[0] = mlp_param("fc1.weight", {F, D.h}, 0, InitKind::kNormal, std);
        if (D.bias) out[1] = mlp_param("fc1.bias", {F}, 0, InitKind::kZeros, 0);
      }
      out[2] = mlp_param("fc2.weight", {D.h, F}, 1, InitKind::kNormal, out_std);
      if (D.bias) out[3] = mlp_param("fc2.bias", {D.h}, -1, InitKind::kZeros, 0);
      return out;
    };
    if (!moe) {
      const auto mlp = add_mlp(p + "mlp.", D.F, r, t, GradGroup::kDense);
      ly.fc1_w = mlp[0];
      ly.fc1_b = mlp[1];
      ly.fc2_w = mlp[2];
      ly.fc2_b = mlp[3];
    } else {  // Megatron's MoE layer: router, routed experts (global index), shared expert
      ly.moe = true;
      ly.router_w = add(p + "mlp.router.weight", {D.experts, D.h}, -1, InitKind::kNormal, std);
      if (D.bias) ly.router_b = add(p + "mlp.router.bias", {D.experts}, -1, InitKind::kNormal, std);  // Megatron: init_method
      if (cfg.moe.moe_router_enable_expert_bias) {  // aux-loss-free balancing: a persistent fp32 buffer, zeros
        ParamInfo bias = make_param(p + "mlp.router.expert_bias", {D.experts}, -1, r, t, InitKind::kZeros, 0);
        bias.trainable = false;
        bias.weight_decay = false;
        ly.expert_bias = put(bias);
      }
      if (cfg.moe.load_balancing_is("quantile_balancing")) {  // Megatron's qb_beta: a persistent fp32 buffer, zeros
        ParamInfo beta = make_param(p + "mlp.router.qb_beta", {D.experts}, -1, r, t, InitKind::kZeros, 0);
        beta.trainable = false;
        beta.weight_decay = false;
        ly.quantile_bias = put(beta);
      }
      for (int64_t j = 0; j < D.experts_local; ++j) {
        LayerParams::Expert ex;
        ex.global = D.ep_rank * D.experts_local + j;
        const auto mlp = add_mlp(p + "mlp.experts." + std::to_string(ex.global) + ".", D.F_moe, D.etp_rank, D.etp, GradGroup::kExpert);
        ex.fc1_w = mlp[0];
        ex.fc1_b = mlp[1];
        ex.fc2_w = mlp[2];
        ex.fc2_b = mlp[3];
        ly.experts.push_back(ex);
      }
      if (D.F_shared > 0) {
        const auto mlp = add_mlp(p + "mlp.shared_experts.", D.F_shared, r, t, GradGroup::kDense);
        ly.shared_fc1_w = mlp[0];
        ly.shared_fc1_b = mlp[1];
        ly.shared_fc2_w = mlp[2];
        ly.shared_fc2_b = mlp[3];
        if (cfg.moe.moe_shared_expert_gate) ly.shared_gate_w = add(p + "mlp.shared_experts.gate.weight", {1, D.h}, -1, InitKind::kNormal, std);
      }
    }
    ly.end = store.size();
    return ly;
  };
  for (int64_t l = M.layers_range.first; l < M.layers_range.end; ++l) {
    M.layers.push_back(add_layer(l, "layers." + std::to_string(l) + ".", moe_layers[static_cast<size_t>(l)]));
  }
  if (M.post_process) {
    M.final_norm_w = add("final_norm.weight", {D.h}, -1, norm_init, 0);
    if (!D.rms) M.final_norm_b = add("final_norm.bias", {D.h}, -1, InitKind::kZeros, 0);
    if (!D.tied) {
      M.output_w = add("output_layer.weight", {D.V, D.h}, 0, InitKind::kNormal, std);
    } else if (M.pre_process) {
      M.output_w = M.word_embeddings;
    } else {  // the last stage's copy of the first stage's word embeddings: the same name, so the same values
      ParamInfo copy = make_param("embedding.word_embeddings.weight", {D.V, D.h}, 0, r, t, InitKind::kNormal, std);
      copy.tied_copy = true;
      M.output_w = put(copy);
    }
    // Multi-token prediction's modules (Megatron's MultiTokenPredictionLayer): the embedding's norm, the hidden state's norm,
    // their projection [h, 2h] (column-parallel in Megatron; whole on every TP rank here, its gradient summed over TP under
    // SP as the norms'), a transformer layer of the last decoder layer's kind (global layer L + k) and its final norm.
    if (D.mtp > 0) {
      if (M.pre_process) {
        M.mtp_embedding = M.word_embeddings;
      } else if (D.tied) {
        M.mtp_embedding = M.output_w;
      } else {  // (pipeline parallelism: the last stage's copy of the first stage's word embeddings, as Megatron's MTP keeps one)
        ParamInfo copy = make_param("embedding.word_embeddings.weight", {D.V, D.h}, 0, r, t, InitKind::kNormal, std);
        copy.tied_copy = true;
        M.mtp_embedding = put(copy);
      }
    }
    for (int64_t k = 0; k < D.mtp; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".";
      MtpParams mp;
      mp.first = store.size();
      mp.enorm_w = add(p + "enorm.weight", {D.h}, -1, norm_init, 0);
      if (!D.rms) mp.enorm_b = add(p + "enorm.bias", {D.h}, -1, InitKind::kZeros, 0);
      mp.hnorm_w = add(p + "hnorm.weight", {D.h}, -1, norm_init, 0);
      if (!D.rms) mp.hnorm_b = add(p + "hnorm.bias", {D.h}, -1, InitKind::kZeros, 0);
      mp.eh_proj_w = add(p + "eh_proj.weight", {D.h, 2 * D.h}, -1, InitKind::kNormal, std);
      mp.layer = add_layer(D.L + k, p + "layer.", moe_layers[static_cast<size_t>(D.L - 1)]);
      mp.final_norm_w = add(p + "final_norm.weight", {D.h}, -1, norm_init, 0);
      if (!D.rms) mp.final_norm_b = add(p + "final_norm.bias", {D.h}, -1, InitKind::kZeros, 0);
      mp.end = store.size();
      M.mtp.push_back(mp);
    }
  }
  return M;
}

}  // namespace

std::vector<ModelLayout> build_model_chunks(const Config& cfg, const LayoutCoordinates& at, ParamStore& store) {
  if (store.size() != 0) throw std::logic_error("build_model_layout: the store already holds parameters");
  const int64_t chunks = at.pp_size == cfg.parallel.pipeline_model_parallel_size ? virtual_stages_per_rank(cfg) : 1;
  std::vector<ModelLayout> out;
  for (int64_t c = 0; c < chunks; ++c) out.push_back(register_model_params(cfg, at, store, c, chunks));
  store.allocate();
  store.initialize(static_cast<uint64_t>(cfg.training.seed));
  return out;
}

ModelLayout build_model_layout(const Config& cfg, const LayoutCoordinates& at, ParamStore& store) {
  std::vector<ModelLayout> chunks = build_model_chunks(cfg, at, store);
  if (chunks.size() != 1) throw std::logic_error("build_model_layout: this stage has " + std::to_string(chunks.size()) + " model chunks");
  return std::move(chunks.front());
}

int64_t model_tensor_count(const Config& cfg) {
  ParamStore names;
  register_model_params(cfg, {}, names, 0, 1);
  return static_cast<int64_t>(names.size());
}

}  // namespace mt
