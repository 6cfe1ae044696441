// gpt_model.h: the GPT / LLaMA decoder for one rank's shard: embedding, transformer layers, final
// norm, output layer and loss, with explicit forward and backward (no autograd tape). Each layer is
// written for its TP shard and calls the TP communicator (a no-op at TP 1).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"

namespace mt {

struct Microbatch {
  int64_t B = 0, S = 0;
  std::vector<int32_t> tokens, labels, positions;  // [B*S]
  std::vector<float> loss_mask;                    // [B*S]
  int64_t first_sample = 0;                        // global index of the first sample (dropout keys)
};

struct ModelDims {
  int64_t L, h, nh, ng, d, F, V, S, max_pos;
  int64_t tp, tp_rank, nh_local, ng_local, F_local, V_local;
  bool rms, swiglu, bias, rope, learned_pos, tied;
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
  void backward(float scale);

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
};

}  // namespace mt
