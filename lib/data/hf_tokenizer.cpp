// hf_tokenizer.cpp: BPE from tokenizer.json, merged by rank as HuggingFace tokenizers' BPE does (the
// lowest-ranked adjacent pair first, leftmost on ties).
#include "data/hf_tokenizer.h"

#if defined(MEGATRAIN_HAVE_ICU_REGEX)
#include <unicode/regex.h>
#include <unicode/unistr.h>
#endif

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <queue>
#include <sstream>

#include "config/errors.h"
#include "data/byte_level.h"

namespace mt {

struct HfBpeTokenizer::Regex {
#if defined(MEGATRAIN_HAVE_ICU_REGEX)
  std::unique_ptr<icu::RegexPattern> pattern;
#endif
};

namespace {

using json = nlohmann::json;

// GPT-2's pattern, which ByteLevel(use_regex = true) applies.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The code points of valid UTF-8 (the byte-level strings this file builds are always valid).
std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t first_code_point(const std::string& c) {
  const auto b0 = static_cast<unsigned char>(c[0]);
  if (b0 < 0x80) return b0;
  if (b0 < 0xE0) return ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(c[1]) & 0x3Fu);
  if (b0 < 0xF0) return ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(c[1]) & 0x3Fu) << 6) | (static_cast<unsigned char>(c[2]) & 0x3Fu);
  return ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(c[1]) & 0x3Fu) << 12) | ((static_cast<unsigned char>(c[2]) & 0x3Fu) << 6) |
         (static_cast<unsigned char>(c[3]) & 0x3Fu);
}

[[maybe_unused]] std::string read_text(const std::filesystem::path& p, const std::string& what) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ConfigError("cannot read " + what + " '" + p.string() + "': check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

[[maybe_unused]] [[noreturn]] void refuse(const std::string& file, const std::string& what) {
  throw ConfigError("HuggingFaceTokenizer: " + file + ": " + what +
                    " is not implemented (megatrain reads BPE tokenizer.json files, byte-level as GPT-2 / Llama 3 or SentencePiece-style as "
                    "Llama 2)");
}

uint64_t pair_key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

// Valid UTF-8 (HuggingFace's tokenizers take Python strings; megatrain refuses what cannot be one).
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// The steps of a tokenizer.json component: a Sequence's list under `list_key`, or the component alone
// (none when null).
[[maybe_unused]] std::vector<json> steps(const json& node, const char* list_key) {
  std::vector<json> out;
  if (node.is_null()) return out;
  if (node.value("type", std::string()) != "Sequence") return {node};
  for (const auto& n : node.value(list_key, json::array())) out.push_back(n);
  return out;
}

[[maybe_unused]] std::string token_content(const json& t) {
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content")) return t["content"].get<std::string>();
  return {};
}

}  // namespace

HfBpeTokenizer::~HfBpeTokenizer() = default;

// A structure other than expected (a field of the wrong type, a missing key) is refused with the file named, never
// the JSON library's own exception text.
HfBpeTokenizer::HfBpeTokenizer(const std::string& path) try : regex_(std::make_unique<Regex>()) {
#if !defined(MEGATRAIN_HAVE_ICU_REGEX)
  (void)path;
  throw ConfigError("this build has no ICU regular expressions, which HuggingFaceTokenizer needs for its pre-tokenizer: "
                    "install libicu-dev and rebuild (scripts/setup.sh does)");
#else
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "tokenizer.json";
  const std::string fname = file.string();
  json j;
  try {
    j = json::parse(read_text(file, "--tokenizer-model"));
  } catch (const json::exception& e) {
    throw ConfigError("--tokenizer-model '" + fname + "' is not valid JSON (a HuggingFace tokenizer.json): " + json_error_text(e));
  }
  const json& model = j.value("model", json::object());
  if (model.value("type", std::string()) != "BPE") refuse(fname, "model type '" + model.value("type", std::string("?")) + "'");
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model[k].is_null() && !model[k].get<std::string>().empty()) refuse(fname, std::string("BPE ") + k);
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) refuse(fname, "BPE dropout");
  // A normalizer only as SentencePiece-style files have it: Prepend and / or one Replace of a plain string.
  const json& norm = j.value("normalizer", json());
  if (!norm.is_null()) {
    for (const auto& n : steps(norm, "normalizers")) {
      const std::string type = n.value("type", std::string());
      if (type == "Prepend" && prepend_.empty() && replace_from_.empty()) {  // applied first, as written
        prepend_ = n.at("prepend").get<std::string>();
      } else if (type == "Replace" && replace_from_.empty() && n.value("pattern", json::object()).contains("String")) {
        replace_from_ = n["pattern"]["String"].get<std::string>();
        replace_to_ = n.value("content", std::string());
      } else {
        refuse(fname, "the normalizer '" + type + "'");
      }
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);

  // Vocabulary and added tokens.
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw ConfigError("HuggingFaceTokenizer: " + fname + " has no model.vocab");
  int32_t max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const auto id = it.value().get<int32_t>();
    if (id < 0 || id > (1 << 28)) throw ConfigError("HuggingFaceTokenizer: " + fname + ": token '" + it.key() + "' has id " + std::to_string(id));
    vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  for (const auto& t : j.value("added_tokens", json::array())) {
    const auto id = t.at("id").get<int32_t>();
    const std::string content = t.at("content").get<std::string>();
    if (id < 0 || id > (1 << 28)) throw ConfigError("HuggingFaceTokenizer: " + fname + ": added token '" + content + "' has id " + std::to_string(id));
    for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
      if (t.value(flag, false)) refuse(fname, "the added token '" + content + "' with " + flag);
    }
    // Without a normalizer both of HuggingFace's passes see the same text; with one, a normalised added
    // token would be matched after normalisation.
    if (t.value("normalized", false) && !norm.is_null()) refuse(fname, "the normalised added token '" + content + "'");
    added_.emplace_back(content, id);
    max_id = std::max(max_id, id);
  }
  std::sort(added_.begin(), added_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [content, id] : added_) added_by_id_[id] = content;
  for (const auto& a : added_) {
    if (!a.first.empty()) added_first_[static_cast<unsigned char>(a.first[0])] = true;
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), "");
  for (const auto& [tok, id] : vocab_) id_to_token_[static_cast<size_t>(id)] = tok;

  // Merges: "left right" strings or [left, right] pairs, ranked by position, keyed by the two ids (so tokens
  // with spaces in the [a, b] form cannot collide); a merge whose parts or result are not tokens is dropped.
  int32_t rank = 0;
  for (const auto& m : model.value("merges", json::array())) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) throw ConfigError("HuggingFaceTokenizer: " + fname + ": the merge '" + s + "' has no space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw ConfigError("HuggingFaceTokenizer: " + fname + ": a merge is neither \"a b\" nor [a, b]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ab = vocab_.find(a + b);
    const int32_t r = rank++;
    if (ia == vocab_.end() || ib == vocab_.end() || ab == vocab_.end()) continue;
    merges_.emplace(pair_key(ia->second, ib->second), std::make_pair(r, ab->second));
  }

  // Pre-tokenizer: ByteLevel (with GPT-2's pattern), or a Split regex followed by ByteLevel.
  std::string pattern;
  bool byte_level = false;
  auto take = [&](const json& p) {
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") {
      if (byte_level) refuse(fname, "two ByteLevel pre-tokenizers");
      byte_level = true;
      add_prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) {
        if (!pattern.empty()) refuse(fname, "two pre-tokenizer patterns");
        pattern = kGpt2Pattern;
      } else if (add_prefix_space_) {
        refuse(fname, "a Split pre-tokenizer with ByteLevel's add_prefix_space");
      }
    } else if (type == "Split") {
      if (byte_level) refuse(fname, "a Split after ByteLevel (the pattern would see byte-level characters)");
      if (!pattern.empty()) refuse(fname, "two pre-tokenizer patterns");
      if (p.value("behavior", std::string()) != "Isolated" || p.value("invert", false)) refuse(fname, "a Split pre-tokenizer other than Isolated");
      const json& pat = p.value("pattern", json::object());
      if (!pat.contains("Regex")) refuse(fname, "a Split on a plain string");
      pattern = pat["Regex"].get<std::string>();
    } else {
      refuse(fname, "the pre-tokenizer '" + type + "'");
    }
  };
  const json& pre = j.value("pre_tokenizer", json());
  sp_style_ = pre.is_null();
  if (sp_style_) {  // SentencePiece-style: the normalizer makes the spaces, the whole piece is one word
    if (norm.is_null()) refuse(fname, "a tokenizer with neither a pre-tokenizer nor a normalizer");
    if (!byte_fallback_) refuse(fname, "a BPE without pre-tokenizer and without byte_fallback");
  } else {
    for (const auto& p : steps(pre, "pretokenizers")) take(p);
    if (!byte_level) refuse(fname, "a pre-tokenizer without ByteLevel");
    if (pattern.empty()) refuse(fname, "ByteLevel without a pattern");
    if (!norm.is_null()) refuse(fname, "a normalizer together with a pre-tokenizer");
    if (byte_fallback_) refuse(fname, "byte_fallback together with a pre-tokenizer");
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto u = vocab_.find(model["unk_token"].get<std::string>());
    if (u != vocab_.end()) unk_id_ = u->second;
  }
  if (!sp_style_) {
    UErrorCode st = U_ZERO_ERROR;
    UParseError pe{};
    regex_->pattern.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, pe, st));
    if (U_FAILURE(st)) throw ConfigError("HuggingFaceTokenizer: " + fname + ": ICU cannot compile the pre-tokenizer pattern " + pattern);
  }

  // Post-processor: TemplateProcessing's special tokens around a single sequence.
  for (const auto& p : steps(j.value("post_processor", json()), "processors")) {
    const std::string type = p.value("type", std::string());
    if (type == "ByteLevel") continue;  // offsets only
    if (type != "TemplateProcessing") refuse(fname, "the post-processor '" + type + "'");
    const json& specials = p.value("special_tokens", json::object());
    bool after = false;
    for (const auto& item : p.value("single", json::array())) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      if (!specials.contains(name)) throw ConfigError("HuggingFaceTokenizer: " + fname + ": the template's " + name + " has no ids");
      for (const auto& id : specials[name].at("ids")) (after ? suffix_ : prefix_).push_back(id.get<int32_t>());
    }
  }

  // The end-of-document token: tokenizer_config.json's eos_token, else a usual end-of-text token.
  std::string eos, bos, cls;
  json cfg_json;
  const auto config = file.parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    try {
      cfg_json = json::parse(read_text(config, "tokenizer_config.json"));
    } catch (const json::exception& e) {
      throw ConfigError("HuggingFaceTokenizer: '" + config.string() + "' is not valid JSON: " + json_error_text(e));
    }
    if (cfg_json.contains("eos_token")) eos = token_content(cfg_json["eos_token"]);
    if (cfg_json.contains("bos_token")) bos = token_content(cfg_json["bos_token"]);
    cls = cfg_json.value("tokenizer_class", std::string());
  }
  auto id_of = [&](const std::string& t) -> int32_t {
    for (const auto& [content, id] : added_) {
      if (content == t) return id;
    }
    const auto it = vocab_.find(t);
    return it == vocab_.end() ? -1 : it->second;
  };
  if (!eos.empty()) {
    eod_ = id_of(eos);
    if (eod_ < 0) throw ConfigError("HuggingFaceTokenizer: eos_token '" + eos + "' of " + config.string() + " is not a token of " + fname);
  } else {
    for (const char* t : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"}) {
      if ((eod_ = id_of(t)) >= 0) break;
    }
    if (eod_ < 0) {
      throw ConfigError("HuggingFaceTokenizer: no end-of-document token in " + fname +
                        ": put its tokenizer_config.json (with eos_token) next to tokenizer.json");
    }
  }

  // transformers builds the Llama and Gemma tokenizers' post-processor from add_bos_token (default on) and
  // add_eos_token (default off) instead of the file's template.
  if (cls.rfind("LlamaTokenizer", 0) == 0 || cls.rfind("CodeLlamaTokenizer", 0) == 0 || cls.rfind("GemmaTokenizer", 0) == 0) {
    const bool add_bos = cfg_json.value("add_bos_token", true), add_eos = cfg_json.value("add_eos_token", false);
    prefix_.clear();
    suffix_.clear();
    if (add_bos) {
      const int32_t b = id_of(bos);
      if (b < 0) throw ConfigError("HuggingFaceTokenizer: add_bos_token without a known bos_token in " + config.string());
      prefix_.push_back(b);
    }
    if (add_eos) suffix_.push_back(eod_);
  }

  byte_level_tables(byte_encoder_, byte_decoder_);
#endif
} catch (const json::exception& e) {
  throw ConfigError("--tokenizer-model '" + path + "' is not a HuggingFace tokenizer.json megatrain can read: " + json_error_text(e));
}

std::vector<std::string> HfBpeTokenizer::pretokenize(std::string_view text) const {
  std::vector<std::string> pieces;
#if defined(MEGATRAIN_HAVE_ICU_REGEX)
  std::string s(text);
  if (add_prefix_space_ && !s.empty() && s[0] != ' ') s.insert(s.begin(), ' ');
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  UErrorCode st = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(regex_->pattern->matcher(u, st));
  if (U_FAILURE(st)) throw std::runtime_error("HuggingFaceTokenizer: ICU could not create a matcher");
  // A pattern from a tokenizer.json may backtrack catastrophically on some text: each find() is bounded (ICU's
  // steps, about a millisecond each: ~2 s) and the stack too, so such a document ends with an error, not a hang.
  m->setTimeLimit(2000, st);
  m->setStackLimit(8 << 20, st);
  auto piece = [&](int32_t from, int32_t to) {
    std::string out;
    u.tempSubString(from, to - from).toUTF8String(out);
    pieces.push_back(std::move(out));
  };
  int32_t last = 0;
  while (m->find(st) && U_SUCCESS(st)) {
    const int32_t a = m->start(st), b = m->end(st);
    if (b == a) continue;  // an empty match cuts nothing
    if (a > last) piece(last, a);
    piece(a, b);
    last = b;
  }
  if (st == U_REGEX_TIME_OUT || st == U_REGEX_STACK_OVERFLOW) {
    throw DataError("HuggingFaceTokenizer: the tokenizer.json's pre-tokenizer pattern " + std::string(st == U_REGEX_TIME_OUT ? "ran past its time limit (seconds)" : "overflowed its stack") +
                    " on one match in a document of " + std::to_string(text.size()) + " bytes (a pattern that backtracks catastrophically?): "
                    "check the Split pattern, or the text");
  }
  if (U_FAILURE(st)) throw std::runtime_error("HuggingFaceTokenizer: ICU failed matching the pre-tokenizer pattern");
  if (last < u.length()) piece(last, u.length());
#else
  (void)text;
#endif
  return pieces;
}

void HfBpeTokenizer::merge(std::vector<Symbol>& sym) const {
  const int n = static_cast<int>(sym.size());
  if (n < 2) return;
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n)), ver(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) prev[static_cast<size_t>(i)] = i - 1, next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  struct Cand {
    int32_t rank, merged;
    int left, right, vl, vr;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int a) {
    if (a < 0) return;
    const int b = next[static_cast<size_t>(a)];
    if (b < 0 || sym[static_cast<size_t>(a)].id < 0 || sym[static_cast<size_t>(b)].id < 0) return;
    const auto m = merges_.find(pair_key(sym[static_cast<size_t>(a)].id, sym[static_cast<size_t>(b)].id));
    if (m != merges_.end()) heap.push({m->second.first, m->second.second, a, b, ver[static_cast<size_t>(a)], ver[static_cast<size_t>(b)]});
  };
  for (int i = 0; i < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    const auto a = static_cast<size_t>(c.left), b = static_cast<size_t>(c.right);
    if (ver[a] != c.vl || ver[b] != c.vr || next[a] != c.right) continue;  // stale: a side merged since
    sym[a].id = c.merged;
    sym[a].text += sym[b].text;
    ++ver[a];
    ver[b] = -1;
    next[a] = next[b];
    if (next[b] >= 0) prev[static_cast<size_t>(next[b])] = c.left;
    push(prev[a]);
    push(c.left);
  }
  std::vector<Symbol> out;
  for (int i = 0; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(std::move(sym[static_cast<size_t>(i)]));
  sym = std::move(out);
}

void HfBpeTokenizer::bpe(const std::string& word, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() < 256;  // as HuggingFace: long words are not cached
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  const auto whole = vocab_.find(word);
  if (ignore_merges_ && whole != vocab_.end()) {
    ids.push_back(whole->second);
  } else {
    std::vector<Symbol> sym;
    for (auto& c : utf8_chars(word)) {
      const auto it = vocab_.find(c);
      if (it == vocab_.end()) throw std::runtime_error("HuggingFaceTokenizer: the byte-level character '" + c + "' is not in the vocabulary");
      sym.push_back({it->second, std::move(c)});
    }
    merge(sym);
    for (const auto& s : sym) ids.push_back(s.id);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (!cacheable) return;
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() < 200000) cache_.emplace(word, std::move(ids));
}

void HfBpeTokenizer::sp_bpe(const std::string& word, std::vector<int32_t>& out) const {
  const auto whole = vocab_.find(word);
  if (ignore_merges_ && whole != vocab_.end()) {
    out.push_back(whole->second);
    return;
  }
  std::vector<Symbol> sym;
  for (auto& c : utf8_chars(word)) {
    const auto it = vocab_.find(c);
    sym.push_back({it == vocab_.end() ? -1 : it->second, std::move(c)});
  }
  merge(sym);
  bool last_unk = false;
  for (const auto& s : sym) {
    if (s.id >= 0) {
      out.push_back(s.id);
      last_unk = false;
      continue;
    }
    bool all_bytes = byte_fallback_;
    std::vector<int32_t> bytes;
    for (unsigned char ch : s.text) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "<0x%02X>", ch);
      const auto b = vocab_.find(hex);
      if (b == vocab_.end()) {
        all_bytes = false;
        break;
      }
      bytes.push_back(b->second);
    }
    if (all_bytes) {
      out.insert(out.end(), bytes.begin(), bytes.end());
      last_unk = false;
    } else {
      if (unk_id_ < 0) throw std::runtime_error("HuggingFaceTokenizer: '" + s.text + "' is not in the vocabulary and there is no unk_token");
      if (!(fuse_unk_ && last_unk)) out.push_back(unk_id_);
      last_unk = true;
    }
  }
}

void HfBpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (sp_style_) {
    std::string s = prepend_ + std::string(text);
    if (!replace_from_.empty()) {
      std::string r;
      for (size_t i = 0; i < s.size();) {
        if (s.compare(i, replace_from_.size(), replace_from_) == 0) {
          r += replace_to_;
          i += replace_from_.size();
        } else {
          r += s[i++];
        }
      }
      s = std::move(r);
    }
    sp_bpe(s, out);
    return;
  }
  for (const auto& p : pretokenize(text)) {
    std::string mapped;
    for (unsigned char c : p) mapped += byte_encoder_[c];
    bpe(mapped, out);
  }
}

std::vector<int32_t> HfBpeTokenizer::encode(std::string_view text) const {
  if (!valid_utf8(text)) throw std::runtime_error("HuggingFaceTokenizer: a document is not valid UTF-8: convert the input to UTF-8");
  std::vector<int32_t> out(prefix_);
  // Added tokens are cut out of the text first (longest first at each position).
  size_t from = 0;
  for (size_t i = 0; i < text.size();) {
    const std::pair<std::string, int32_t>* hit = nullptr;
    if (added_first_[static_cast<unsigned char>(text[i])]) {
      for (const auto& a : added_) {
        if (!a.first.empty() && text.compare(i, a.first.size(), a.first) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_plain(text.substr(from, i - from), out);
    out.push_back(hit->second);
    i += hit->first.size();
    from = i;
  }
  encode_plain(text.substr(from), out);
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::string HfBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    const auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      out += added->second;
      continue;
    }
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) continue;
    const std::string& tok = id_to_token_[static_cast<size_t>(id)];
    if (sp_style_) {  // <0xXX> bytes, the replacement back to what it replaced; one leading space stripped below
      if (tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>') {
        out += static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16));
        continue;
      }
      for (size_t i = 0; i < tok.size();) {  // one pass: the replacement back to what it replaced
        if (!replace_to_.empty() && tok.compare(i, replace_to_.size(), replace_to_) == 0) {
          out += replace_from_;
          i += replace_to_.size();
        } else {
          out += tok[i++];
        }
      }
      continue;
    }
    for (const auto& c : utf8_chars(tok)) {
      const auto it = byte_decoder_.find(first_code_point(c));
      if (it != byte_decoder_.end()) out += static_cast<char>(it->second);
    }
  }
  if (sp_style_ && !prepend_.empty() && !out.empty() && out[0] == ' ') out.erase(0, 1);  // the prepended space
  return out;
}

}  // namespace mt
