// hf_layout.h: the tensor layout conversions between megatrain (Megatron's layouts) and HuggingFace's, shared
// by export and import so that each is the other's exact inverse.
#pragma once

#include <cstdint>
#include <vector>

namespace mt::hf {

using Values = std::vector<float>;

// An MoE layer's HF names: Mixtral's block_sparse_moe.{gate, experts.E.w1 / w3 / w2} or Qwen3-MoE's
// mlp.{gate, experts.E.gate_proj / up_proj / down_proj} (megatrain's router, fc1_gate, fc1_up, fc2).
struct HfMoeNames {
  const char *block, *gate, *up, *down;
};
inline HfMoeNames hf_moe_names(bool qwen3_moe) {
  return qwen3_moe ? HfMoeNames{"mlp.", "gate_proj", "up_proj", "down_proj"} : HfMoeNames{"block_sparse_moe.", "w1", "w3", "w2"};
}

// A [rows, cols] matrix transposed (GPT-2's Conv1D weights are [in, out]).
inline Values transposed(const Values& w, int64_t rows, int64_t cols) {
  Values t(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = w[static_cast<size_t>(r * cols + c)];
  }
  return t;
}

// Megatron's grouped QKV rows (per query group: its query heads, then its key, then its value head, d rows each)
// and HF's separate Q [nh d], K [ng d], V [ng d] rows; cols 1 for a bias.
struct SplitQkv {
  Values q, k, v;
};
inline SplitQkv split_qkv(const Values& qkv, int64_t nh, int64_t ng, int64_t d, int64_t cols) {
  const int64_t per = nh / ng;
  SplitQkv s;
  for (int64_t g = 0; g < ng; ++g) {
    const auto base = qkv.begin() + g * (per + 2) * d * cols;
    s.q.insert(s.q.end(), base, base + per * d * cols);
    s.k.insert(s.k.end(), base + per * d * cols, base + (per + 1) * d * cols);
    s.v.insert(s.v.end(), base + (per + 1) * d * cols, base + (per + 2) * d * cols);
  }
  return s;
}
inline Values merge_qkv(const Values& q, const Values& k, const Values& v, int64_t nh, int64_t ng, int64_t d, int64_t cols) {
  const int64_t per = nh / ng;
  Values out;
  out.reserve(q.size() + k.size() + v.size());
  for (int64_t g = 0; g < ng; ++g) {
    out.insert(out.end(), q.begin() + g * per * d * cols, q.begin() + (g + 1) * per * d * cols);
    out.insert(out.end(), k.begin() + g * d * cols, k.begin() + (g + 1) * d * cols);
    out.insert(out.end(), v.begin() + g * d * cols, v.begin() + (g + 1) * d * cols);
  }
  return out;
}

}  // namespace mt::hf
