// sentencepiece_tokenizer.cpp: the library encodes; what Megatron adds around it (special tokens, bos) is here.
#include "data/sentencepiece_tokenizer.h"

#include <map>
#include <vector>

#include "config/errors.h"

#ifdef MEGATRAIN_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mt {

#ifdef MEGATRAIN_HAVE_SENTENCEPIECE
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& type, const std::string& path) : type_(type) {
    const auto status = sp_.Load(path);
    if (!status.ok()) {
      throw ConfigError("--tokenizer-model " + path + " is not a SentencePiece model (" + status.ToString() + "): give the .model file");
    }
    size_ = sp_.GetPieceSize();
    eos_ = sp_.eos_id();
    bos_ = sp_.bos_id();
    if (type_ == "SentencePieceTokenizer") add_megatron_specials();
    if (type_ != "SentencePieceTokenizer" && eos_ < 0) {
      throw ConfigError(type_ + " needs a SentencePiece model with an end-of-sentence piece (eos_id), for the end of documents: " + path + " has none");
    }
    if (type_ == "Llama2Tokenizer" && bos_ < 0) {
      throw ConfigError("Llama2Tokenizer needs a SentencePiece model with a beginning-of-sentence piece (bos_id): " + path + " has none");
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    if (type_ == "Llama2Tokenizer") out.push_back(bos_);
    if (special_.empty()) {
      append(out, text);
      return out;
    }
    // Megatron's _SentencePieceTokenizer.tokenize: the earliest special token in the rest of the text (ties: the
    // first in its table's order), the text before it encoded, then its id.
    size_t at = 0;
    while (true) {
      size_t best = std::string_view::npos;
      const Special* which = nullptr;
      for (const Special& s : special_) {
        const size_t p = text.find(s.text, at);
        if (p != std::string_view::npos && (best == std::string_view::npos || p < best)) {
          best = p;
          which = &s;
        }
      }
      if (!which) break;
      append(out, text.substr(at, best - at));
      out.push_back(which->id);
      at = best + which->text.size();
    }
    append(out, text.substr(at));
    return out;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      if (run.empty()) return;
      std::string s;
      (void)sp_.Decode(run, &s);
      out += s;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id >= 0 && id < size_) {
        run.push_back(id);
        continue;
      }
      flush();
      for (const Special& s : special_) {
        if (s.id == id) out += s.text;
      }
    }
    flush();
    return out;
  }

  int64_t vocab_size() const override { return size_ + added_; }
  int32_t eod() const override { return type_ == "SentencePieceTokenizer" ? eod_ : eos_; }
  std::string name() const override { return type_; }

 private:
  struct Special {
    std::string text;
    int32_t id;
  };

  void append(std::vector<int32_t>& out, std::string_view text) const {
    if (text.empty()) return;
    std::vector<int> ids;
    (void)sp_.Encode(std::string(text), &ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Megatron's _SentencePieceTokenizer._initalize (vocab_extra_ids 0).
  void add_megatron_specials() {
    auto add = [&](const std::string& t) {
      int32_t id = sp_.PieceToId(t);
      const bool in_model = id >= 0 && id < size_ && sp_.IdToPiece(id) == t;
      if (!in_model) {
        id = static_cast<int32_t>(size_ + added_);
        ++added_;
      }
      special_.push_back({t, id});
      return id;
    };
    auto piece_or = [&](int id, const std::string& fallback) { return id >= 0 && id < size_ ? sp_.IdToPiece(id) : fallback; };
    add("<CLS>");
    add("<SEP>");
    eod_ = add("<EOD>");
    add("<MASK>");
    add(piece_or(sp_.pad_id(), "<PAD>"));
    add(piece_or(bos_, "<BOS>"));
    add(piece_or(eos_, "<EOS>"));
  }

  std::string type_;
  sentencepiece::SentencePieceProcessor sp_;
  int32_t size_ = 0, added_ = 0, eos_ = -1, bos_ = -1, eod_ = -1;
  std::vector<Special> special_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& type, const std::string& model_file) {
  if (model_file.empty()) throw ConfigError(type + " needs --tokenizer-model: the SentencePiece .model file");
  return std::make_unique<SentencePieceTokenizer>(type, model_file);
}
#else
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const std::string& type, const std::string&) {
  throw ConfigError(type + " needs the SentencePiece library, which this build lacks: install libsentencepiece-dev and rebuild (scripts/setup.sh)");
}
#endif

}  // namespace mt
