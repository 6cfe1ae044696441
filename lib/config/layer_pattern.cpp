// layer_pattern.cpp: a small recursive-descent reader for Megatron's per-layer list expressions.
#include "config/layer_pattern.h"

#include <algorithm>
#include <cctype>

#include "config/errors.h"

namespace mt {
namespace {

class PatternReader {
 public:
  PatternReader(const std::string& t, const std::string& flag) : text_(t), flag_(flag) {}
  std::vector<int64_t> read() {
    std::vector<int64_t> v = sum();
    skip();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError("--" + flag_ + " '" + text_ + "': " + why + " at character " + std::to_string(pos_ + 1) +
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
  const std::string& flag_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<bool> parse_layer_pattern(const std::string& given, int64_t num_layers, const std::string& flag, LayerEvery every,
                                      const std::string& what, bool* integer_form) {
  if (integer_form) *integer_form = false;
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
    if (n < 1) throw ConfigError("--" + flag + " '" + text + "' must be an integer >= 1 or a list such as \"[0]+[1]*3\"");
    if (every == LayerEvery::kLast && num_layers % n != 0) {
      throw ConfigError("--" + flag + " " + std::to_string(n) + " must divide --num-layers " + std::to_string(num_layers) +
                        " (as Megatron requires): give a divisor, or a list of 0/1 per layer");
    }
    for (int64_t l = 0; l < num_layers; ++l) out[static_cast<size_t>(l)] = every == LayerEvery::kFirst ? l % n == 0 : (l + 1) % n == 0;
    if (integer_form) *integer_form = true;
    return out;
  }
  const std::vector<int64_t> v = PatternReader(text, flag).read();
  if (static_cast<int64_t>(v.size()) != num_layers) {
    throw ConfigError("--" + flag + " '" + text + "' lists " + std::to_string(v.size()) + " layers, but --num-layers is " +
                      std::to_string(num_layers) + ": give one 0/1 per layer");
  }
  for (size_t l = 0; l < v.size(); ++l) {
    if (v[l] > 1) throw ConfigError("--" + flag + " '" + text + "': entries are " + what + ", found " + std::to_string(v[l]));
    out[l] = v[l] == 1;
  }
  return out;
}

bool rope_skipping_given(const Config& cfg) {  // (0 is off, as Megatron's `if self.no_rope_freq:` reads it)
  const std::string text = cfg.model.no_rope_freq.value_or("");
  const size_t a = text.find_first_not_of(" \t"), b = text.find_last_not_of(" \t");
  return a != std::string::npos && text.substr(a, b - a + 1) != "0";
}

std::vector<bool> rope_skipped_layers(const Config& cfg) {
  if (!rope_skipping_given(cfg)) return {};
  return parse_layer_pattern(*cfg.model.no_rope_freq, cfg.model.num_layers.value_or(0), "no-rope-freq", LayerEvery::kLast,
                             "0 (RoPE) or 1 (no RoPE)");
}

}  // namespace mt
