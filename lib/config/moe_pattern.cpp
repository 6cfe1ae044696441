// moe_pattern.cpp: a small recursive-descent reader for Megatron's --moe-layer-freq list expressions.
#include "config/moe_pattern.h"

#include <cctype>

#include "config/errors.h"

namespace mt {
namespace {

class PatternReader {
 public:
  explicit PatternReader(const std::string& t) : text_(t) {}
  std::vector<int64_t> read() {
    std::vector<int64_t> v = sum();
    skip();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("--moe-layer-freq '" + text_ + "': " + why + " at character " + std::to_string(pos_ + 1) +
                      ": give an integer N or a list of 0/1 per layer such as \"[0]+[1]*3\"");
  }
  void skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  int64_t integer() {
    skip();
    if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) fail("expected a number");
    int64_t v = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > 1000000) fail("number too large");
    }
    return v;
  }
  std::vector<int64_t> sum() {
    std::vector<int64_t> v = product();
    while (eat('+')) {
      std::vector<int64_t> w = product();
      v.insert(v.end(), w.begin(), w.end());
    }
    return v;
  }
  // A list repeated: list * n, or n * list.
  std::vector<int64_t> product() {
    skip();
    int64_t times = 1;
    if (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      times = integer();
      if (!eat('*')) fail("a number alone is not a list");
    }
    std::vector<int64_t> base = atom();
    while (eat('*')) {
      times *= integer();
      if (times > 1000000) fail("the pattern is too long");
    }
    if (static_cast<int64_t>(base.size()) * times > 1000000) fail("the pattern is too long");
    std::vector<int64_t> v;
    for (int64_t i = 0; i < times; ++i) v.insert(v.end(), base.begin(), base.end());
    return v;
  }
  std::vector<int64_t> atom() {
    if (eat('(')) {
      std::vector<int64_t> v = sum();
      if (!eat(')')) fail("expected ')'");
      return v;
    }
    if (!eat('[')) fail("expected '[' or '('");
    std::vector<int64_t> v;
    if (eat(']')) return v;
    do {
      v.push_back(integer());
    } while (eat(','));
    if (!eat(']')) fail("expected ']'");
    return v;
  }
  const std::string& text_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<bool> parse_moe_layer_freq(const std::string& given, int64_t num_layers) {
  std::vector<bool> out(static_cast<size_t>(std::max<int64_t>(0, num_layers)), false);
  // A pattern still inside the quotes that a launcher script wrote for a second shell ("'([1]*48)'", as scripts that
  // hand their Megatron flags to `ray job submit` or `bash -c` do): those quotes are not part of it.
  std::string text = given;
  const size_t a = text.find_first_not_of(" \t"), b = text.find_last_not_of(" \t");
  if (a != std::string::npos && b > a && (text[a] == '\'' || text[a] == '"') && text[b] == text[a]) text = text.substr(a + 1, b - a - 1);
  size_t first = text.find_first_not_of(" \t");
  if (first != std::string::npos && std::isdigit(static_cast<unsigned char>(text[first])) && text.find_first_of("[(*+") == std::string::npos) {
    int64_t n = 0;
    try {
      size_t used = 0;
      n = std::stoll(text, &used);
      if (text.find_first_not_of(" \t", used) != std::string::npos) n = -1;
    } catch (const std::exception&) {
      n = -1;
    }
    if (n < 1) throw ConfigError("--moe-layer-freq '" + text + "' must be an integer >= 1 or a list such as \"[0]+[1]*3\"");
    for (int64_t l = 0; l < num_layers; ++l) out[static_cast<size_t>(l)] = l % n == 0;
    return out;
  }
  const std::vector<int64_t> v = PatternReader(text).read();
  if (static_cast<int64_t>(v.size()) != num_layers) {
    throw ConfigError("--moe-layer-freq '" + text + "' lists " + std::to_string(v.size()) + " layers, but --num-layers is " +
                      std::to_string(num_layers) + ": give one 0/1 per layer");
  }
  for (size_t l = 0; l < v.size(); ++l) {
    if (v[l] > 1) throw ConfigError("--moe-layer-freq '" + text + "': entries are 0 (dense) or 1 (MoE), found " + std::to_string(v[l]));
    out[l] = v[l] == 1;
  }
  return out;
}

std::vector<bool> moe_layer_pattern(const Config& cfg) {
  const int64_t L = cfg.model.num_layers.value_or(0);
  if (!cfg.moe.num_experts) return std::vector<bool>(static_cast<size_t>(std::max<int64_t>(0, L)), false);
  return parse_moe_layer_freq(cfg.moe.moe_layer_freq, L);
}

bool is_moe_layer(const Config& cfg, int64_t layer) {
  if (!cfg.moe.num_experts) return false;
  const std::vector<bool> p = moe_layer_pattern(cfg);
  return layer >= 0 && layer < static_cast<int64_t>(p.size()) && p[static_cast<size_t>(layer)];
}

}  // namespace mt
