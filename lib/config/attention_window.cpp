// attention_window.cpp: --window-size and --window-attn-skip-freq per layer.
#include "config/attention_window.h"

#include <algorithm>

#include "config/errors.h"
#include "config/layer_pattern.h"

namespace mt {

AttentionWindowSize parse_window_size(const std::string& given) {
  std::string text;
  for (char ch : given) {
    if (ch != ' ' && ch != '\t' && ch != '(' && ch != ')' && ch != '\'' && ch != '"') text += ch;
  }
  const size_t comma = text.find(',');
  auto number = [&](const std::string& part) -> int64_t {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size()) {
      throw ConfigError("--window-size '" + given + "' must be two integers \"LEFT,RIGHT\" (Megatron's tuple, -1 unbounded), e.g. 4095,0");
    }
    return v;
  };
  if (comma == std::string::npos || text.find(',', comma + 1) != std::string::npos) {
    throw ConfigError("--window-size '" + given + "' must be two integers \"LEFT,RIGHT\" (Megatron's tuple, -1 unbounded), e.g. 4095,0");
  }
  AttentionWindowSize w{number(text.substr(0, comma)), number(text.substr(comma + 1))};
  if (w.left < -1 || w.right < -1) throw ConfigError("--window-size '" + given + "': the bounds are >= 0, or -1 for unbounded");
  return w;
}

std::vector<int64_t> attention_windows(const Config& cfg) {
  const int64_t L = cfg.model.num_layers.value_or(0);
  if (!cfg.model.window_size) return {};
  const AttentionWindowSize w = parse_window_size(*cfg.model.window_size);
  if (w.left < 0) return {};
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(0, L)), w.left);
  if (!cfg.model.window_attn_skip_freq) return out;
  // An integer N marks the layers with full attention (numbers divisible by N), a list those with the window (1).
  bool integer = false;
  const std::vector<bool> marked = parse_layer_pattern(*cfg.model.window_attn_skip_freq, L, "window-attn-skip-freq", LayerEvery::kLastAnyCount,
                                                       "1 (sliding window) or 0 (full attention)", &integer);
  for (int64_t l = 0; l < L; ++l) {
    if (marked[static_cast<size_t>(l)] == integer) out[static_cast<size_t>(l)] = -1;
  }
  return out;
}

}  // namespace mt
