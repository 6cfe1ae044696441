// gpt_model.h: the GPT / LLaMA decoder for one rank's shard: embedding, transformer layers, final
// norm, output layer and loss, with explicit forward and backward (no autograd tape). Each layer is
// written for its TP shard and calls the TP communicator (a no-op at TP 1).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"

namespace mt {

// The dropout mask key of one sample at one site, for a training step: site 0 the embedding output (layer
// -1), 1 the attention probabilities (sample 0: one key per layer), 2 the attention block's output, 3 the
// MLP's output. Element i of the sample's [S, h] tokens is dropped when philox_uniform(key, i) < p. Both
// engines draw the same masks from it.
uint64_t dropout_key(uint64_t seed, int64_t step, int64_t sample, int64_t layer, int site);
enum DropoutSite : int { kDropEmbedding = 0, kDropAttnProbs = 1, kDropAttnOut = 2, kDropMlpOut = 3 };

struct Microbatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens, labels, positions;  // [B*S]
  std::vector<float> loss_mask;                    // [B*S]
  std::vector<int32_t> row_start;                  // [B*S] with --reset-attention-mask, else empty
  int64_t first_sample = 0;                        // global index of the first sample (dropout keys)
};

struct ModelDims {
  int64_t L, h, nh, ng, d, F, V, S, max_pos;
  int64_t tp, tp_rank, nh_local, ng_local, F_local, V_local;
  // --num-query-groups below TP: each group's K/V (and its whole QKV block) is replicated on kv_rep TP
  // ranks, each computing its nh_local query heads of it. qh_local: query heads in the local QKV rows.
  int64_t kv_rep, qh_local;
  bool rms, swiglu, bias, rope, learned_pos, tied, sequence_parallel;
  bool qk_norm;  // --qk-layernorm: the configured norm over each query and key head (width d), before RoPE
  float eps, rope_base, hidden_dropout, attention_dropout, softmax_scale;
  int64_t rot_dim;
};

ModelDims model_dims(const Config& cfg, int64_t tp_rank, int64_t tp_size);

class GPTModel {
 public:
  GPTModel(const Config& cfg, ProcessGroups groups);
  ~GPTModel();

  ParamStore& params() { return params_; }
  const ModelDims& dims() const { return dims_; }

  // Forward and loss (mean over unmasked tokens); keeps what backward needs. `step` keys dropout.
  float forward(const Microbatch& mb, int64_t step, bool training = true);
  // Backward of the last forward: gradients of (loss * scale) accumulate into params().grads().
  // `last_microbatch`: this backward completes the iteration's gradients, so the per-layer reductions
  // (sequence-parallel partial sums over TP) and the grads-ready hook run; earlier microbatches only
  // accumulate (the partial sums add up, one reduction at the end is exact).
  void backward(float scale, bool last_microbatch = true);
  // Called during backward whenever the gradients of every parameter at flat offset >= `lowest` are
  // final for this backward (data parallel launches its bucket reductions from here).
  void set_grads_ready_hook(std::function<void(int64_t lowest)> hook) { grads_ready_ = std::move(hook); }

 private:
  struct Layer;
  struct Record;
  ModelDims dims_;
  ProcessGroups groups_;
  uint64_t seed_;
  ParamStore params_;
  size_t wte_ = 0, wpe_ = 0, final_w_ = 0, final_b_ = 0, out_w_ = 0;
  bool has_final_b_ = false;
  std::vector<Layer> layers_;
  std::unique_ptr<Record> rec_;
  std::function<void(int64_t)> grads_ready_;
  // Sequence parallelism: local tokens are [t0, t0 + Tl) of the microbatch's B*S.
  void gather_tokens(const float* local, float* full, int64_t Tl) const;
  void reduce_tokens(float* full_partial, float* local, int64_t Tl) const;
  void dropout_tokens(float* x, int64_t t0, int64_t n, int64_t layer, int site, bool backward) const;
  void all_reduce_replicated_grads(size_t first, size_t last) const;
  // The configured norm (RMSNorm or LayerNorm) with weight w and bias b (bias unused for RMSNorm).
  void norm_forward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t n);
  void norm_backward(float* dx, const float* dout, const float* x, const float* mean, const float* rstd, size_t w, size_t b,
                     int64_t n);
  // --qk-layernorm: the same norm over n rows of one attention head (width d); mean / rstd sized here.
  using Buf = std::vector<float>;
  void head_norm_forward(float* out, Buf& mean, Buf& rstd, const float* x, size_t w, size_t b, int64_t n);
  void head_norm_backward(float* dx, const float* dout, const float* x, const Buf& mean, const Buf& rstd, size_t w, size_t b, int64_t n);
  bool finishing_ = true;  // the running backward is the iteration's last
  std::shared_ptr<Communicator> kv_group_;  // the TP ranks sharing this rank's K/V (kv_rep > 1)
};

}  // namespace mt
