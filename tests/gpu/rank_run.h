// rank_run.h: one rank's CUDA model in the GPU tests that run a parallel layout's ranks as threads of one process
// (thread_collectives.h): its layout shard, model, stream, staged microbatch and loss accumulator; one microbatch's
// forward and backward; and where a TP shard's elements sit in the whole tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "model/model_dims.h"
#include "train/microbatch_staging.h"

namespace mt::test {

struct RankRun {
  mt::ParamStore store;
  std::unique_ptr<mt::CudaGPT> model;
  std::unique_ptr<mt::MicrobatchSlot> slot;
  mt::DeviceMicrobatch dev;
  cudaStream_t stream = nullptr;
  float* acc = nullptr;
};

// One microbatch's forward and backward on `run`, its loss added to run.acc with weight w. `last`: the iteration's
// last microbatch, whose backward completes the gradients over TP (the SP-replicated ones, the router's) as the
// engine's last microbatch does; an earlier one's backward only accumulates.
inline void forward_backward(RankRun& run, float w, bool last = true) {
  run.model->set_final_backward(last);
  run.model->forward(run.dev, w, w, run.acc, 0);
  run.model->backward(run.dev, 0);
  if (cudaStreamSynchronize(run.stream) != cudaSuccess) throw std::runtime_error("the model's stream failed");
}

// Stages microbatch mb on run's model (its slot replaced): the tokens, and with hidden dropout each sample's keys (the
// embedding's, then per layer the attention block's and the MLP's), as the engine's steps make them.
inline void stage(RankRun& run, const mt::Config& cfg, const mt::Microbatch& mb) {
  const mt::ModelDims& D = run.model->dims();
  std::vector<uint64_t> keys;
  const auto seed = static_cast<uint64_t>(cfg.training.seed);
  for (int64_t b = 0; cfg.model.hidden_dropout > 0 && b < mb.B; ++b) {
    keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, -1, mt::kDropEmbedding));
    for (int64_t l = 0; l < D.L; ++l) {
      keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, l, mt::kDropAttnOut));
      keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, l, mt::kDropMlpOut));
    }
  }
  if (run.slot) cudaStreamSynchronize(run.stream);  // (the previous microbatch's work done before its slot goes)
  run.slot = std::make_unique<mt::MicrobatchSlot>(mb.B * mb.S, static_cast<int64_t>(keys.size()));
  run.dev = run.slot->upload(mb, D.learned_pos, D.tp_rank * D.V_local, D.V_local, D.max_pos, run.stream, [](cudaEvent_t e) { cudaEventSynchronize(e); },
                             keys);
}

// The model of the rank at `at` (its TP collectives `tp`, null at TP 1) with microbatch mb staged, its gradients and
// loss accumulator zeroed.
inline void prepare(RankRun& run, const mt::Config& cfg, const mt::Microbatch& mb, const mt::LayoutCoordinates& at, mt::StreamCollectives* tp = nullptr) {
  const mt::ModelLayout where = mt::build_model_layout(cfg, at, run.store);
  cudaStreamCreateWithFlags(&run.stream, cudaStreamNonBlocking);
  run.model = std::make_unique<mt::CudaGPT>(cfg, run.store, where, run.stream, tp, true, nullptr, 1);
  stage(run, cfg, mb);
  cudaMalloc(&run.acc, 4);
  cudaMemsetAsync(run.model->grads(), 0, static_cast<size_t>(run.model->numel()) * 4, run.stream);
  cudaMemsetAsync(run.acc, 0, 4, run.stream);
  cudaStreamSynchronize(run.stream);
}

inline void release(RankRun& run) {
  run.model.reset();
  run.slot.reset();
  cudaFree(run.acc);
  cudaStreamDestroy(run.stream);
}

// extra without its --fp8-* flags and their values.
inline std::string without_fp8_flags(const std::string& extra) {
  std::string out, word;
  bool skip_value = false;
  for (size_t i = 0; i <= extra.size(); ++i) {
    if (i < extra.size() && extra[i] != ' ') {
      word += extra[i];
      continue;
    }
    if (word.empty()) continue;
    if (skip_value && word.rfind("--", 0) != 0) {
      skip_value = false;
    } else if (word.rfind("--fp8-", 0) == 0) {
      skip_value = true;
    } else {
      skip_value = false;
      out += word + " ";
    }
    word.clear();
  }
  return out;
}

// Global element index of local element e of a TP shard (row-major, split along shard_dim), as checkpoints assemble them.
inline int64_t global_index(const mt::ParamInfo& p, int64_t e) {
  if (p.shard_dim < 0 || p.shard_count <= 1) return e;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(p.shard_dim) + 1; d < p.local_shape.size(); ++d) inner *= p.local_shape[d];
  const int64_t dl = p.local_shape[static_cast<size_t>(p.shard_dim)], dg = p.global_shape[static_cast<size_t>(p.shard_dim)];
  return ((e / (inner * dl)) * dg + p.shard_rank * dl + (e / inner) % dl) * inner + e % inner;
}

}  // namespace mt::test
