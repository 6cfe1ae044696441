// tokenizer.h: text -> token ids. GPT2BPETokenizer (vocab.json + merges.txt, byte-level BPE, exact
// GPT-2 ids), HuggingFaceTokenizer (a local BPE tokenizer.json: byte-level as GPT-2 / Llama 3, or
// SentencePiece-style as Llama 2),
// NullTokenizer (--vocab-size; ids are given, not made), ByteTokenizer (UTF-8 bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace mt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;
  virtual std::string name() const = 0;
};

// From --tokenizer-type and its files; throws ConfigError naming what is missing or wrong.
std::unique_ptr<Tokenizer> make_tokenizer(const Config& cfg);
// tokenizer_model: HuggingFaceTokenizer's tokenizer.json (or its directory); null_eod: NullTokenizer's end of document
// (-1: --vocab-size, its extra id).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& vocab_file,
                                          const std::string& merge_file, int64_t vocab_size, const std::string& tokenizer_model = "",
                                          int64_t null_eod = -1);
// Megatron's padding id for the GPT dataset: NullTokenizer's --null-tokenizer-pad-id (-1, none, otherwise).
int32_t pad_token_id(const Config& cfg);

}  // namespace mt
