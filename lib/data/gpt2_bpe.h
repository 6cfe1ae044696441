// gpt2_bpe.h: GPT-2's byte-level BPE. Pre-tokenisation by GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with JavaScript's \s and Unicode general categories (ICU), bytes mapped to printable characters,
// then merges by rank. The ids equal those of the reference encoder of npm gpt-3-encoder@1.1.4,
// including its quirk of keying merge pairs by "first,second".
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"

namespace mt {

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  Gpt2BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(decoder_.size()); }
  int32_t eod() const override { return eod_; }
  std::string name() const override { return "GPT2BPETokenizer"; }

  // The pre-tokenised pieces of text (UTF-8), for tests.
  static std::vector<std::string> pretokenize(std::string_view text);

 private:
  void bpe(const std::string& token, std::vector<int32_t>& out) const;
  std::unordered_map<std::string, int32_t> encoder_;
  std::vector<std::string> decoder_;
  std::unordered_map<std::string, int32_t> ranks_;  // "first,second" -> rank (last one wins, as in JS)
  // This tokenizer's key in each thread's cache of encoded pieces: a number never reused (an address would be,
  // by a tokenizer built where a destroyed one was, which would then read the other's ids).
  uint64_t cache_key_ = 0;
  std::string byte_encoder_[256];                   // byte -> UTF-8 of its printable stand-in
  std::unordered_map<uint32_t, uint8_t> byte_decoder_;
  int32_t eod_ = 50256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace mt
