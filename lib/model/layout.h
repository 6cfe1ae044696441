// layout.h: the one parameter layout both engines and the checkpoints use. From the configuration and this
// rank's coordinates (pipeline stage, TP rank; later the EP rank) it registers the stage's parameters in a
// ParamStore: global names (global layer index), global and local shapes, shard slices, initialisation,
// flat offsets in registration order, and each parameter's gradient group. It returns where each unit's
// parameters sit, so no engine looks parameters up by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "config/config.h"
#include "model/params.h"

namespace mt {

inline constexpr size_t kNoParam = std::numeric_limits<size_t>::max();

// Where this rank's shard of the model sits in the grid.
struct LayoutCoordinates {
  int64_t tp_rank = 0, tp_size = 1;
  int64_t pp_rank = 0, pp_size = 1;
  int64_t ep_rank = 0, ep_size = 1;    // expert parallelism: which experts this rank holds
  int64_t etp_rank = 0, etp_size = 1;  // expert tensor parallelism: which slice of each expert's MLP
};

// The transformer layers [first, end) of model chunk `chunk` of pipeline stage `pp_rank` of `pp_size`: the
// configured split when pp_size is --pipeline-model-parallel-size (config/resolve.h layers_per_virtual_stage:
// even, uneven with --decoder-first / --decoder-last-pipeline-num-layers, the embedding / loss counted as
// layers, interleaved chunks), else an even split of --num-layers (one chunk). Throws ConfigError when the
// layers do not divide.
struct LayerRange {
  int64_t first = 0, end = 0;
  int64_t count() const { return end - first; }
};
LayerRange stage_layers(const Config& cfg, int64_t pp_rank, int64_t pp_size, int64_t chunk = 0);

// The parameter indices (into the ParamStore) of one transformer layer's slots; kNoParam where the model
// has none (biases without --add-bias-linear, LayerNorm biases under RMSNorm, --qk-layernorm's norms).
struct LayerParams {
  int64_t layer = 0;  // global layer index
  // input norm + attention slot
  size_t input_norm_w = kNoParam, input_norm_b = kNoParam, qkv_w = kNoParam, qkv_b = kNoParam;
  size_t q_norm_w = kNoParam, q_norm_b = kNoParam, k_norm_w = kNoParam, k_norm_b = kNoParam;
  size_t softmax_offset = kNoParam;  // --softmax-type learnable: the heads' sink logits [nh], split over TP
  // Multi-latent attention (qkv_w .. k_norm_b stay kNoParam): the query projection [nh (dn + dr), h] split over TP, or
  // the query latent's down projection [q_lora_rank, h] (whole on every TP rank), its norm (--qk-layernorm) and up
  // projection [nh (dn + dr), q_lora_rank] split over TP; the keys' and values' down projection [kv_lora_rank + dr, h]
  // (whole), the latent's norm and up projection [nh (dn + dv), kv_lora_rank] split over TP (per head dn key rows,
  // then dv value rows).
  size_t q_proj_w = kNoParam, q_down_w = kNoParam, q_latent_norm_w = kNoParam, q_latent_norm_b = kNoParam, q_up_w = kNoParam;
  size_t kv_down_w = kNoParam, kv_latent_norm_w = kNoParam, kv_latent_norm_b = kNoParam, kv_up_w = kNoParam;
  size_t proj_w = kNoParam, proj_b = kNoParam;
  // pre-MLP norm + MLP slot (SwiGLU: fc1_w is the gate, the up projection's shard follows it in the flat buffer)
  size_t mlp_norm_w = kNoParam, mlp_norm_b = kNoParam, fc1_w = kNoParam, fc1_b = kNoParam, fc2_w = kNoParam, fc2_b = kNoParam;
  // An MoE layer's MLP slot (moe): the router [E, h] (replicated over TP), this rank's experts (global index, each
  // an MLP sliced over expert-TP; SwiGLU: gate and up slices side by side as in the dense MLP), and the shared
  // expert (a dense MLP over TP; kNoParam without --moe-shared-expert-intermediate-size). fc1_w .. fc2_b above
  // stay kNoParam in an MoE layer.
  struct Expert {
    int64_t global = 0;
    size_t fc1_w = kNoParam, fc1_b = kNoParam, fc2_w = kNoParam, fc2_b = kNoParam;
  };
  bool moe = false;
  size_t router_w = kNoParam, router_b = kNoParam;
  size_t expert_bias = kNoParam;  // --moe-router-enable-expert-bias: [E], not trained (ParamInfo::trainable false)
  size_t quantile_bias = kNoParam;  // quantile_balancing's qb_beta: [E], not trained
  std::vector<Expert> experts;
  size_t shared_fc1_w = kNoParam, shared_fc1_b = kNoParam, shared_fc2_w = kNoParam, shared_fc2_b = kNoParam;
  size_t shared_gate_w = kNoParam;  // --moe-shared-expert-gate: [1, h], on every TP rank
  // The layer's parameters are the indices [first, end) (registration order); the dense ones are contiguous in the
  // flat buffers, the experts' sit in the expert range after every dense parameter (ParamStore::group_range), and
  // the expert bias and qb_beta (not trainable) after both.
  size_t first = 0, end = 0;
};

// One multi-token prediction module's parameters (--mtp-num-layers; on the stage with the loss): the norms of the shifted
// tokens' embedding and of the previous hidden state, their projection [h, 2h] (whole on every TP rank), the transformer
// layer and its final norm; the module's parameters are the indices [first, end).
struct MtpParams {
  size_t enorm_w = kNoParam, enorm_b = kNoParam, hnorm_w = kNoParam, hnorm_b = kNoParam, eh_proj_w = kNoParam;
  LayerParams layer;
  size_t final_norm_w = kNoParam, final_norm_b = kNoParam;
  size_t first = 0, end = 0;
};

struct ModelLayout {
  LayerRange layers_range;
  bool pre_process = true;   // this stage holds the embedding
  bool post_process = true;  // this stage holds the final norm, the output layer and the loss
  size_t word_embeddings = kNoParam, position_embeddings = kNoParam;  // pre_process
  size_t final_norm_w = kNoParam, final_norm_b = kNoParam;            // post_process
  // post_process: the output layer; with tied embeddings the word embeddings (on a stage that also holds
  // them) or this stage's copy of them (tied_copy).
  size_t output_w = kNoParam;
  std::vector<LayerParams> layers;  // layers_range.count() of them, in order
  std::vector<MtpParams> mtp;       // post_process: the multi-token prediction modules, in order (after the output layer)
  // post_process with multi-token prediction: the word embeddings its modules read (the stage's own, the tied output layer's
  // copy, or a copy of the first stage's registered for them, kept equal as the tied copy is)
  size_t mtp_embedding = kNoParam;
  size_t embedding_end = 0;         // one past the embedding's parameter indices (0 without the embedding)
  // This rank's place in the expert grid (LayoutCoordinates'): the MoE layers' experts are EP rank ep_rank's.
  int64_t ep_rank = 0, ep_size = 1, etp_rank = 0, etp_size = 1;
};

// Registers the parameters of the stage at `at` in `store` (which must be empty), allocates and
// initialises them (seed: --seed) and returns where each sits: one layout per model chunk of the stage
// (virtual pipeline stages; the chunks one after another in the flat buffers), the embedding in the first
// virtual stage's, the output layer in the last's.
std::vector<ModelLayout> build_model_chunks(const Config& cfg, const LayoutCoordinates& at, ParamStore& store);
// The same for a stage of one chunk (throws std::logic_error for more).
ModelLayout build_model_layout(const Config& cfg, const LayoutCoordinates& at, ParamStore& store);
// The whole model's tensors (distinct global names, whatever the split): what a checkpoint of it holds.
int64_t model_tensor_count(const Config& cfg);

}  // namespace mt
