// hf_tokenizer.h: --tokenizer-type HuggingFaceTokenizer from a local tokenizer.json (HuggingFace
// tokenizers' format) with a BPE model of one of two kinds. Byte-level (GPT-2, Llama 3, ...): text is cut
// at the added (special) tokens, pre-tokenised by the file's Split regex (ICU) or ByteLevel's GPT-2
// pattern, mapped to byte-level characters and merged by rank. SentencePiece-style (Llama 2, Mistral, ...:
// a Prepend / Replace normalizer turning spaces into U+2581, no pre-tokenizer, byte_fallback): each piece
// between added tokens is normalised and merged as one word, characters outside the vocabulary becoming
// <0xXX> byte tokens; a TemplateProcessing
// post-processor adds its special tokens around each document, as the Python tokenizer does by default
// (Megatron's _HuggingFaceTokenizer.tokenize). Other models, normalizers and pre-tokenizers are refused by
// name. The end-of-document id is tokenizer_config.json's eos_token (next to tokenizer.json), else one of
// the usual end-of-text added tokens.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace mt {

class HfBpeTokenizer final : public Tokenizer {
 public:
  // `path`: tokenizer.json, or a directory holding it.
  explicit HfBpeTokenizer(const std::string& path);
  // Megatron's --tokenizer-hf-no-include-special-tokens (HF's add_special_tokens=False): no post-processor tokens.
  void leave_out_special_tokens() {
    prefix_.clear();
    suffix_.clear();
  }
  ~HfBpeTokenizer() override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }  // the largest id + 1
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "HuggingFaceTokenizer"; }
  // The pre-tokenised pieces of text between added tokens (UTF-8), for tests.
  std::vector<std::string> pretokenize(std::string_view text) const;

 private:
  struct Symbol {
    int32_t id;  // -1: a character outside the vocabulary (SentencePiece-style; byte fallback later)
    std::string text;
  };
  // Merges adjacent symbols by rank with a heap, as HuggingFace's BPE (lowest rank first, leftmost on ties):
  // O(n log n) in the word's length.
  void merge(std::vector<Symbol>& sym) const;
  void bpe(const std::string& word, std::vector<int32_t>& out) const;
  void sp_bpe(const std::string& word, std::vector<int32_t>& out) const;  // SentencePiece-style, one whole piece
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  std::unordered_map<int32_t, std::string> added_by_id_;
  std::vector<std::pair<std::string, int32_t>> added_;   // content -> id, longest first
  bool added_first_[256] = {};                           // bytes an added token starts with
  std::vector<int32_t> prefix_, suffix_;                 // the post-processor's special tokens
  bool ignore_merges_ = false;
  // SentencePiece-style: the normalizer's prepended string and one string replacement, byte fallback.
  bool sp_style_ = false, byte_fallback_ = false, fuse_unk_ = false;
  std::string prepend_, replace_from_, replace_to_;
  int32_t unk_id_ = -1;
  bool add_prefix_space_ = false;
  std::string byte_encoder_[256];
  std::unordered_map<uint32_t, uint8_t> byte_decoder_;
  int32_t eod_ = -1;
  struct Regex;
  std::unique_ptr<Regex> regex_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace mt
