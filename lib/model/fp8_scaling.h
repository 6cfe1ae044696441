// fp8_scaling.h: Transformer Engine's delayed FP8 scaling (Megatron's default --fp8-recipe delayed), the state and
// its update rule, shared by both engines and the checkpoints.
//
// Each FP8 layer's four linear sites (QKV, projection, fc1, fc2; an MoE layer's experts' fc1 and fc2 after them, two
// sites an expert, the shared expert's the layer's fc1 and fc2) have three scaled tensors: the input and the weight
// (forward, E4M3) and the output gradient (backward, E5M2 under hybrid). Each has a scale and an amax history of
// --fp8-amax-history-len entries, entry 0 accumulating (max) the amax of every cast since the last update. A cast
// quantises with the scale as it stands (x * scale rounded and saturated), it does not wait for its own amax:
//  - the forward scales update at the end of each training microbatch's forward on the stage (TE: at each
//    outermost fp8_autocast exit), the gradient scales at the end of its backward;
//  - an update takes each entry 0's max over the amax group (TP x DP x CP, Megatron's default amax reduction group),
//    then per tensor with a non-zero amax: the history rolls (the amax moves to the last entry, entry 0 starts again
//    at 0), amax = that amax (most_recent) or the history's max (max), and scale = (fp8 max / 2^margin) / amax where
//    amax is finite and positive (else unchanged), the largest float where that overflows. A tensor with amax 0 (not
//    cast since) keeps its history and scale. This is TE's fused update (delayed_scaling.cu), computed in fp32 the
//    same way on the CPU and the GPU;
//  - a weight is cast once per iteration, at its first training microbatch (TE caches it with is_first_microbatch,
//    as Megatron passes it): the later microbatches, and the backward, use that cast's scale; the others record no
//    amax;
//  - a recomputed layer (CUDA engine) casts with the scales of its microbatch's first forward and records nothing;
//  - an evaluation forward casts with the current scales and records nothing (TE would fold its amax into the next
//    training update; here evaluation does not steer training).
// Scales start at 1, histories at 0. Checkpoints carry every FP8 layer's scales and histories.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "model/model_dims.h"

#ifdef __CUDACC__
#define MT_HOST_DEVICE __host__ __device__
#else
#define MT_HOST_DEVICE
#endif

namespace mt {

// The three scaled tensors of a linear site, and the four sites of a layer. An MoE layer's routed experts have two
// sites each after those (fp8_expert_site: expert j's fc1 and fc2, Transformer Engine's grouped linear keeping a
// quantiser per GEMM); its shared expert takes the layer's fc1 and fc2 sites, as a dense MLP.
enum Fp8Tensor : int { kFp8Input = 0, kFp8Weight = 1, kFp8GradOutput = 2 };
constexpr int kFp8Sites = 4;
constexpr int fp8_expert_site(int64_t expert, bool fc2) { return kFp8Sites + 2 * static_cast<int>(expert) + (fc2 ? 1 : 0); }

struct Fp8DelayedRecipe {
  int64_t history_len = 1;
  bool max_algo = false;  // --fp8-amax-compute-algo max (else most_recent)
  int64_t margin = 0;
  float forward_max = 448.0f, backward_max = 57344.0f;  // the formats' largest values (E4M3; E5M2 under hybrid)
  // fp8 max / 2^margin, in fp32 (exact: a power of 2 below a representable value).
  float scaled_max(bool forward) const { return std::ldexp(forward ? forward_max : backward_max, -static_cast<int>(margin)); }
};

inline Fp8DelayedRecipe fp8_delayed_recipe(const ModelDims& D) {
  Fp8DelayedRecipe r;
  r.history_len = D.fp8_history_len;
  r.max_algo = D.fp8_max_algo;
  r.margin = D.fp8_margin;
  r.backward_max = D.fp8_grad_e5m2 ? 57344.0f : 448.0f;
  return r;
}

// One tensor's update after the reduction. history [len] (entry k at history[k * stride]); returns the new scale.
MT_HOST_DEVICE inline float fp8_delayed_update(float* history, int64_t stride, int64_t len, bool max_algo, float scaled_max, float scale) {
  const float last = history[0];
  if (last == 0.0f) return scale;  // not cast since the last update: nothing moves
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    const float a = i < len - 1 ? history[(i + 1) * stride] : last;
    amax = fmaxf(amax, a);
    history[i * stride] = i > 0 ? a : 0.0f;
  }
  // (for len 1 the loop leaves history[0] = 0)
  if (!max_algo) amax = last;
  if (!(amax > 0.0f && amax <= FLT_MAX)) return scale;  // zero, infinite or NaN: unchanged
  const float s = scaled_max / amax;
  return s > FLT_MAX ? FLT_MAX : s;
}

// The scaling state of one pipeline stage (or model chunk): its FP8 layers' sites, in the order of `layers` (global
// layer indices), each layer's 4 + 2 x experts[i] sites back to back: slot(i, site) = first[i] + site (i * 4 + site
// without experts, the layout the CUDA engine keeps on the device); scale[k][slot], history[entry][k][slot] (the
// accumulators, entry 0, of the three kinds contiguous: what an update reduces).
struct Fp8ScalingState {
  Fp8DelayedRecipe recipe;
  std::vector<int64_t> layers;
  std::vector<int64_t> experts;  // per layer: its routed experts' count (an MoE layer's on this rank; 0: none)
  std::vector<int64_t> first;    // per layer: its first slot
  std::vector<float> scale;    // [3][n]
  std::vector<float> history;  // [len][3][n]
  // The weights' scales as their cast of this iteration used them (kFp8Weight's at the first microbatch).
  std::vector<float> weight_cast_scale;  // [n]

  Fp8ScalingState() = default;
  Fp8ScalingState(const Fp8DelayedRecipe& r, std::vector<int64_t> fp8_layers, std::vector<int64_t> layer_experts = {});
  int64_t slots() const { return n_slots_; }
  int64_t slot(int64_t index, int site) const { return first[static_cast<size_t>(index)] + site; }
  static int64_t layer_sites(int64_t experts) { return kFp8Sites + 2 * experts; }  // a layer's sites
  float* scales(int kind) { return scale.data() + kind * slots(); }
  const float* scales(int kind) const { return scale.data() + kind * slots(); }
  float* amax_accumulator(int kind) { return history.data() + kind * slots(); }
  // Updates kinds [first, last] from their accumulators (already reduced over the amax group).
  void update(int first_kind, int last_kind);
  // A layer's state for checkpoints: [4 + 2 x experts sites][3 kinds][1 + len] (the scale, then the history).
  std::vector<float> layer_state(int64_t index) const;
  // Restores it; a history of another length (another --fp8-amax-history-len) keeps the scales and starts the
  // history afresh. Returns false for data of the wrong size.
  bool set_layer_state(int64_t index, const std::vector<float>& data, int64_t saved_len);
  int64_t index_of(int64_t global_layer) const;  // -1: not an FP8 layer of this state

 private:
  int64_t n_slots_ = 0;
};

// The saved state's length of one layer's entry for a history of `len` (an MoE layer: with its experts' sites).
inline int64_t fp8_layer_state_size(int64_t len, int64_t experts = 0) { return Fp8ScalingState::layer_sites(experts) * 3 * (1 + len); }

}  // namespace mt
