// gpt2_bpe.cpp: GPT-2 byte-level BPE, matched to the gpt-3-encoder@1.1.4 reference.
#include "data/gpt2_bpe.h"

#include <atomic>

#if defined(MEGATRAIN_HAVE_ICU)
#include <unicode/uchar.h>
#endif

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/errors.h"
#include "data/byte_level.h"

namespace mt {
namespace {

// WHATWG UTF-8 decoding: invalid sequences become U+FFFD, one per maximal subpart (as node reads text).
std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  uint32_t cp = 0;
  int need = 0, seen = 0;
  unsigned lower = 0x80, upper = 0xBF;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (need == 0) {
      if (b < 0x80) {
        out.push_back(b);
      } else if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
        cp = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower = 0xA0;
        if (b == 0xED) upper = 0x9F;
        need = 2;
        cp = b & 0xF;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower = 0x90;
        if (b == 0xF4) upper = 0x8F;
        need = 3;
        cp = b & 0x7;
      } else {
        out.push_back(0xFFFD);
      }
      continue;
    }
    if (b < lower || b > upper) {
      cp = 0;
      need = seen = 0;
      lower = 0x80;
      upper = 0xBF;
      out.push_back(0xFFFD);
      --i;  // reprocess this byte
      continue;
    }
    lower = 0x80;
    upper = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
    if (++seen == need) {
      out.push_back(cp);
      cp = 0;
      need = seen = 0;
    }
  }
  if (need != 0) out.push_back(0xFFFD);
  return out;
}

bool js_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

#if !defined(MEGATRAIN_HAVE_ICU)
// Without ICU the constructor refuses to build the tokenizer; these are never reached.
enum { U_UPPERCASE_LETTER, U_LOWERCASE_LETTER, U_TITLECASE_LETTER, U_MODIFIER_LETTER, U_OTHER_LETTER, U_DECIMAL_DIGIT_NUMBER,
       U_LETTER_NUMBER, U_OTHER_NUMBER, U_UNASSIGNED };
int8_t u_charType(int32_t) { return U_UNASSIGNED; }
using UChar32 = int32_t;
#endif

bool letter(uint32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER || t == U_MODIFIER_LETTER ||
         t == U_OTHER_LETTER;
}

bool number(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

bool other(uint32_t c) { return !js_space(c) && !letter(c) && !number(c); }

// Length (in code points) of the GPT-2 pattern's match at i; always >= 1.
size_t match_at(const std::vector<uint32_t>& cp, size_t i) {
  const size_t n = cp.size();
  if (cp[i] == '\'' && i + 1 < n) {
    const uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  for (auto cls : {letter, number, other}) {
    size_t j = i;
    if (cp[j] == ' ' && j + 1 < n && cls(cp[j + 1])) ++j;
    if (cls(cp[j])) {
      while (j < n && cls(cp[j])) ++j;
      return j - i;
    }
  }
  // \s+(?!\S), else \s+
  size_t j = i;
  while (j < n && js_space(cp[j])) ++j;
  const size_t run = j - i;
  if (j == n || run == 1) return run;
  return run - 1;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(std::string("cannot read ") + what + " '" + path + "': check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

using Cache = std::unordered_map<std::string, std::vector<int32_t>>;

}  // namespace

Gpt2BpeTokenizer::Gpt2BpeTokenizer(const std::string& vocab_path, const std::string& merges_path) {
#if !defined(MEGATRAIN_HAVE_ICU)
  throw ConfigError("this build has no ICU, which GPT2BPETokenizer needs for Unicode letters and numbers: "
                    "install libicu-dev and rebuild (scripts/setup.sh does)");
#endif
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_path, "--vocab-file"));
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("--vocab-file '" + vocab_path + "' is not valid JSON (a GPT-2 vocab.json / encoder.json): " + json_error_text(e));
  }
  if (!vocab.is_object() || vocab.empty()) throw ConfigError("--vocab-file '" + vocab_path + "' is not a token -> id object");
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) throw ConfigError("--vocab-file '" + vocab_path + "': id of '" + it.key() + "' is not an integer");
    const auto wide = it.value().get<int64_t>();
    // Ids index the decoder and the embedding rows: negative or absurd ones are a damaged file.
    if (wide < 0 || wide >= (int64_t{1} << 24)) {
      throw ConfigError("--vocab-file '" + vocab_path + "': id " + std::to_string(wide) + " of '" + it.key() + "' is outside [0, 2^24)");
    }
    const auto id = static_cast<int32_t>(wide);
    encoder_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  static std::atomic<uint64_t> next_key{1};
  cache_key_ = next_key++;
  decoder_.assign(static_cast<size_t>(max_id + 1), "");
  for (const auto& [k, v] : encoder_) decoder_[static_cast<size_t>(v)] = k;
  const auto eot = encoder_.find("<|endoftext|>");
  eod_ = eot != encoder_.end() ? eot->second : max_id;

  // merges: lines[1:-1] (the "#version" header and the text after the last newline are dropped, as
  // the reference does); each line's whitespace-separated parts keyed joined by ",".
  const std::string merges = read_file(merges_path, "--merge-file");
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p; (p = merges.find('\n', start)) != std::string::npos; start = p + 1) lines.push_back(merges.substr(start, p - start));
  lines.push_back(merges.substr(start));
  if (lines.size() < 3) throw ConfigError("--merge-file '" + merges_path + "' has no merges (expected GPT-2 merges.txt / vocab.bpe)");
  for (size_t li = 1; li + 1 < lines.size(); ++li) {
    const auto cps = decode_utf8(lines[li]);
    std::string key, part;
    bool first = true;
    auto flush = [&] {
      if (part.empty()) return;
      key += (first ? "" : ",") + part;
      first = false;
      part.clear();
    };
    for (uint32_t c : cps) {
      if (js_space(c)) flush();
      else append_utf8(part, c);
    }
    flush();
    ranks_[key] = static_cast<int32_t>(li - 1);
  }
  // bytes_to_unicode: printable bytes map to themselves, the rest to 256 + n.
  byte_level_tables(byte_encoder_, byte_decoder_);
}

std::vector<std::string> Gpt2BpeTokenizer::pretokenize(std::string_view text) {
  const auto cp = decode_utf8(text);
  std::vector<std::string> out;
  for (size_t i = 0; i < cp.size();) {
    const size_t len = match_at(cp, i);
    std::string piece;
    for (size_t k = i; k < i + len; ++k) append_utf8(piece, cp[k]);
    out.push_back(std::move(piece));
    i += len;
  }
  return out;
}

void Gpt2BpeTokenizer::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  thread_local std::unordered_map<uint64_t, Cache> caches;
  Cache& cache = caches[cache_key_];
  if (auto it = cache.find(piece); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<std::string> word;
  for (unsigned char b : piece) word.push_back(byte_encoder_[b]);
  constexpr double kUnknown = 10e10;
  while (word.size() > 1) {
    double best = std::numeric_limits<double>::infinity();
    size_t best_k = 0;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      const auto it = ranks_.find(word[k] + "," + word[k + 1]);
      const double r = it == ranks_.end() ? kUnknown : it->second;
      if (r <= best) {  // equal ranks: the later pair wins, as with the reference's object keys
        best = r;
        best_k = k;
      }
    }
    if (best >= kUnknown) break;
    const std::string first = word[best_k], second = word[best_k + 1];
    std::vector<std::string> merged;
    size_t i = 0;
    while (i < word.size()) {
      size_t j = i;
      while (j < word.size() && word[j] != first) ++j;
      if (j == word.size()) {
        merged.insert(merged.end(), word.begin() + static_cast<long>(i), word.end());
        break;
      }
      merged.insert(merged.end(), word.begin() + static_cast<long>(i), word.begin() + static_cast<long>(j));
      i = j;
      if (i + 1 < word.size() && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const auto& w : word) {
    const auto it = encoder_.find(w);
    if (it == encoder_.end()) throw std::runtime_error("GPT-2 vocabulary lacks the symbol '" + w + "': vocab and merges do not match");
    ids.push_back(it->second);
  }
  if (cache.size() > 1000000) cache.clear();
  out.insert(out.end(), ids.begin(), ids.end());
  cache.emplace(piece, std::move(ids));
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  const auto cp = decode_utf8(text);
  std::string piece;
  for (size_t i = 0; i < cp.size();) {
    const size_t len = match_at(cp, i);
    piece.clear();
    for (size_t k = i; k < i + len; ++k) append_utf8(piece, cp[k]);
    bpe(piece, out);
    i += len;
  }
  return out;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string sym;
  for (auto id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= decoder_.size()) throw std::out_of_range("token id " + std::to_string(id) + " outside the vocabulary");
    sym += decoder_[static_cast<size_t>(id)];
  }
  std::string out;
  for (uint32_t c : decode_utf8(sym)) {
    const auto it = byte_decoder_.find(c);
    if (it != byte_decoder_.end()) out += static_cast<char>(it->second);
  }
  return out;
}

}  // namespace mt
