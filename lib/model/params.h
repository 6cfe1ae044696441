// params.h: the parameters of one rank's model shard in contiguous fp32 buffers (weights and their
// gradient accumulators), each parameter a view with its global shape, its shard and how it is
// initialised. Flat buffers are what DP buckets, the distributed optimizer and checkpoints work on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace mt {

enum class InitKind { kNormal, kZeros, kOnes };

// Which reduction a parameter's gradient takes after the backward: dense parameters over the data-parallel
// group; expert parameters (MoE) over the expert-data-parallel group.
enum class GradGroup { kDense, kExpert };

struct ParamInfo {
  std::string name;                   // global name, e.g. "layers.3.mlp.fc2.weight"
  std::vector<int64_t> global_shape;  // shape of the whole parameter
  std::vector<int64_t> local_shape;   // shape of this rank's shard
  int shard_dim = -1;                 // dimension split over TP (-1: replicated)
  int64_t shard_rank = 0, shard_count = 1;
  // > 0: this rank holds a copy of the shard another TP rank also holds (the K/V replication of
  // --num-query-groups below TP): it is neither written to checkpoints nor counted in norms here.
  int64_t replica = 0;
  GradGroup grad_group = GradGroup::kDense;
  // The last pipeline stage's copy of the tied word embeddings (the output layer when the embedding sits on
  // the first stage): same name and values as the embedding, its gradient summed with it over the embedding
  // group; not written to checkpoints.
  bool tied_copy = false;
  // The model chunk (virtual pipeline stage) of this rank that holds it: chunks sit one after another in the
  // flat buffers, and no gradient bucket spans two.
  int64_t chunk = 0;
  InitKind init = InitKind::kNormal;
  float init_std = 0.02f;
  bool weight_decay = true;           // Megatron: no decay on biases and norm weights
  // false: state kept with the parameters and checkpointed, but no optimizer touches it (Megatron's persistent
  // buffers: the router's expert bias, updated outside the gradient). Such buffers sit after every trainable
  // parameter in the flat buffers, in no gradient group.
  bool trainable = true;
  int64_t offset = 0;                 // element offset in the flat buffers
  int64_t numel = 0;
  // Every TP rank holds the whole parameter (norms, row-parallel biases, positions): under sequence
  // parallelism its gradient is a partial sum over the rank's tokens.
  // Expert parameters are never TP-replicated: they live on the expert grid (see expert_tp_replicated()).
  bool tp_replicated() const { return shard_dim < 0 && grad_group == GradGroup::kDense; }
  // An expert parameter every expert-TP rank holds whole (an expert's fc2 bias): its gradient is a partial sum
  // over the rows that rank received.
  bool expert_tp_replicated() const { return shard_dim < 0 && grad_group == GradGroup::kExpert; }
};

// The flat buffers place every parameter on a multiple of this many elements (ParamStore::allocate).
inline constexpr int64_t kParamAlignment = 8;

class ParamStore {
 public:
  // Registers a parameter; returns its index. allocate() assigns the offsets: registration order within each
  // gradient group, the dense group first.
  size_t add(ParamInfo info);
  // Allocates the flat buffers (zeroed), the expert parameters' offsets after all the dense ones, the buffers
  // (trainable false) last. No add() after this.
  void allocate();
  // Draws every parameter from the counter-based RNG: element e of the *global* tensor of parameter p
  // gets normal(key(seed, p.name), e) * std, so a shard holds exactly its slice of the full model.
  void initialize(uint64_t seed);
  // Elements [lo, hi) of parameter i's initial values (as initialize draws them) into out[lo, hi).
  void initial_values(size_t i, uint64_t seed, float* out, int64_t lo, int64_t hi) const;

  size_t size() const { return infos_.size(); }
  int64_t numel() const { return total_; }
  // The flat range of one gradient group's trainable parameters: allocate() places the dense parameters first and
  // the expert parameters after them, each group in registration order.
  std::pair<int64_t, int64_t> group_range(GradGroup g) const;
  bool has_experts() const { return group_range(GradGroup::kExpert).second > group_range(GradGroup::kExpert).first; }
  const ParamInfo& info(size_t i) const { return infos_[i]; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  size_t index_of(const std::string& name) const;

  float* param(size_t i) const { return params_.f32() + infos_[i].offset; }
  float* grad(size_t i) const { return grads_.f32() + infos_[i].offset; }
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  void zero_grads();
  // Frees the gradient buffer of a store whose gradients live elsewhere (the CUDA engine's host model, which
  // serves the layout, the initial values and checkpoints only); grad() is invalid afterwards.
  void release_grads() { grads_ = Tensor(); }

  // Global element index of local element `local` of parameter i (for init and resharding).
  int64_t global_index(size_t i, int64_t local) const;

 private:
  std::vector<ParamInfo> infos_;
  int64_t total_ = 0;
  Tensor params_, grads_;
};

}  // namespace mt
