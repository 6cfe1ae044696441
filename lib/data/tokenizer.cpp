// tokenizer.cpp: the simple tokenizers and the factory.
#include "data/tokenizer.h"

#include "data/sentencepiece_tokenizer.h"

#include "config/errors.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"

namespace mt {
namespace {

// UTF-8 bytes as ids 0..255, end of document 256.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size());
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (auto id : ids) {
      if (id >= 0 && id < 256) s += static_cast<char>(id);
    }
    return s;
  }
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  std::string name() const override { return "ByteTokenizer"; }
};

// Megatron's NullTokenizer: text is whitespace-separated ids; --vocab-size V ids plus the end of document V, so the
// vocabulary is V + 1 (Megatron's _NullTokenizer: vocab_size = V + 1, eod = V).
class NullTokenizer final : public Tokenizer {
 public:
  NullTokenizer(int64_t v, int64_t eod) : v_(v + 1), eod_(eod >= 0 ? static_cast<int32_t>(eod) : static_cast<int32_t>(v)) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    std::string cur;
    auto flush = [&] {
      if (cur.empty()) return;
      char* end = nullptr;
      const long id = std::strtol(cur.c_str(), &end, 10);
      if (*end != '\0' || id < 0 || id >= v_) throw ConfigError("NullTokenizer: '" + cur + "' is not an id up to --vocab-size (its end of document)");
      out.push_back(static_cast<int32_t>(id));
      cur.clear();
    };
    for (char c : text) {
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
      else cur += c;
    }
    flush();
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) s += ' ';
      s += std::to_string(ids[i]);
    }
    return s;
  }
  int64_t vocab_size() const override { return v_; }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "NullTokenizer"; }

 private:
  int64_t v_;
  int32_t eod_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file, const std::string& merge_file,
                                          int64_t vocab_size, const std::string& tokenizer_model, int64_t null_eod) {
  if (type == "HuggingFaceTokenizer") {
    if (tokenizer_model.empty()) {
      throw ConfigError("HuggingFaceTokenizer needs --tokenizer-model: a local tokenizer.json, or the directory holding it "
                        "(megatrain does not download models)");
    }
    return std::make_unique<HfBpeTokenizer>(tokenizer_model);
  }
  if (type == "GPT2BPETokenizer") {
    if (vocab_file.empty() || merge_file.empty()) {
      throw ConfigError("GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
    }
    return std::make_unique<Gpt2BpeTokenizer>(vocab_file, merge_file);
  }
  if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer") {
    return make_sentencepiece_tokenizer(type, tokenizer_model);
  }
  if (type == "ByteTokenizer") return std::make_unique<ByteTokenizer>();
  if (type == "NullTokenizer") {
    if (vocab_size < 1) throw ConfigError("NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(vocab_size, null_eod);
  }
  throw ConfigError("--tokenizer-type " + type +
                    " is not implemented: use GPT2BPETokenizer, HuggingFaceTokenizer (a BPE tokenizer.json), SentencePieceTokenizer, "
                    "GPTSentencePieceTokenizer, Llama2Tokenizer (a SentencePiece .model), NullTokenizer or ByteTokenizer");
}

int32_t pad_token_id(const Config& cfg) {
  return cfg.data.tokenizer_type.value_or("") == "NullTokenizer" ? static_cast<int32_t>(cfg.data.null_tokenizer_pad_id) : -1;
}

std::unique_ptr<Tokenizer> make_tokenizer(const Config& cfg) {
  return make_tokenizer(cfg.data.tokenizer_type.value_or(""), cfg.data.vocab_file.value_or(""), cfg.data.merge_file.value_or(""),
                        cfg.model.vocab_size.value_or(0), cfg.data.tokenizer_model.value_or(""), cfg.data.null_tokenizer_eod_id.value_or(-1));
}

}  // namespace mt
