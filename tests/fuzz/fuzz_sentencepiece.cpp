// fuzz_sentencepiece.cpp: libFuzzer target for SentencePiece model files (--tokenizer-model with
// SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer). Any input must load or be refused with an
// error, never crash or hang; a model that loads must encode and decode a fixed text.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "config/errors.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = write_fuzz_file("tokenizer.model", data, size);
  try {
    const auto tok = mt::make_sentencepiece_tokenizer("Llama2Tokenizer", path);
    const auto ids = tok->encode("Hello world, 123 tokens: ünïcödé ok\n\t  end");
    (void)tok->decode(ids);
    (void)tok->eod();
  } catch (const std::runtime_error&) {  // ConfigError included
  }
  return 0;
}
