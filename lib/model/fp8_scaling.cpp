// fp8_scaling.cpp: the delayed-scaling state's host side (the CPU engine's updates, checkpoints' layout).
#include "model/fp8_scaling.h"

#include <algorithm>
#include <utility>

namespace mt {

Fp8ScalingState::Fp8ScalingState(const Fp8DelayedRecipe& r, std::vector<int64_t> fp8_layers, std::vector<int64_t> layer_experts)
    : recipe(r), layers(std::move(fp8_layers)), experts(std::move(layer_experts)) {
  experts.resize(layers.size(), 0);
  for (int64_t e : experts) {
    first.push_back(n_slots_);
    n_slots_ += layer_sites(e);
  }
  const auto n = static_cast<size_t>(slots());
  scale.assign(3 * n, 1.0f);
  history.assign(3 * static_cast<size_t>(recipe.history_len) * n, 0.0f);
  weight_cast_scale.assign(n, 1.0f);
}

void Fp8ScalingState::update(int first_kind, int last_kind) {
  const int64_t n = slots(), len = recipe.history_len;
  for (int k = first_kind; k <= last_kind; ++k) {
    const float scaled_max = recipe.scaled_max(k != kFp8GradOutput);
    float* h = amax_accumulator(k);
    float* s = scales(k);
    for (int64_t i = 0; i < n; ++i) s[i] = fp8_delayed_update(h + i, 3 * n, len, recipe.max_algo, scaled_max, s[i]);
  }
}

std::vector<float> Fp8ScalingState::layer_state(int64_t index) const {
  const int64_t n = slots(), len = recipe.history_len;
  const int64_t E = experts[static_cast<size_t>(index)];
  std::vector<float> out;
  out.reserve(static_cast<size_t>(fp8_layer_state_size(len, E)));
  for (int site = 0; site < layer_sites(E); ++site) {
    const int64_t slot = this->slot(index, site);
    for (int k = 0; k < 3; ++k) {
      out.push_back(scale[static_cast<size_t>(k * n + slot)]);
      for (int64_t e = 0; e < len; ++e) out.push_back(history[static_cast<size_t>((e * 3 + k) * n + slot)]);
    }
  }
  return out;
}

bool Fp8ScalingState::set_layer_state(int64_t index, const std::vector<float>& data, int64_t saved_len) {
  const int64_t E = experts[static_cast<size_t>(index)];
  if (saved_len < 1 || static_cast<int64_t>(data.size()) != fp8_layer_state_size(saved_len, E)) return false;
  const int64_t n = slots(), len = recipe.history_len;
  size_t at = 0;
  for (int site = 0; site < layer_sites(E); ++site) {
    const int64_t slot = this->slot(index, site);
    for (int k = 0; k < 3; ++k) {
      scale[static_cast<size_t>(k * n + slot)] = data[at];
      for (int64_t e = 0; e < saved_len; ++e) {
        if (saved_len == len) history[static_cast<size_t>((e * 3 + k) * n + slot)] = data[at + 1 + static_cast<size_t>(e)];
      }
      at += 1 + static_cast<size_t>(saved_len);
    }
  }
  return true;
}

int64_t Fp8ScalingState::index_of(int64_t global_layer) const {
  const auto it = std::find(layers.begin(), layers.end(), global_layer);
  return it == layers.end() ? -1 : static_cast<int64_t>(it - layers.begin());
}

}  // namespace mt
