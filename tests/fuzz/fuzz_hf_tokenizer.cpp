// fuzz_hf_tokenizer.cpp: libFuzzer target for HuggingFace tokenizer.json files (--tokenizer-type
// HuggingFaceTokenizer). Any input must load or be refused with an error (ConfigError / runtime_error), never
// crash or hang; a file that loads must encode a fixed text (pre-tokenizer regex, byte fallback, merges) and
// decode what it produced.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "config/errors.h"
#include "data/hf_tokenizer.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = write_fuzz_file("tokenizer.json", data, size);
  try {
    mt::HfBpeTokenizer tok(path);
    const auto ids = tok.encode("Hello world, 123 tokens: ünïcödé \xE2\x96\x81 ok\n\t  end");
    (void)tok.decode(ids);
  } catch (const std::runtime_error&) {  // ConfigError and DataError included
  }
  return 0;
}
