// fuzz_gpt2_bpe.cpp: libFuzzer target for GPT-2 BPE files (--vocab-file / --merge-file) and the text they encode.
// The first byte picks what the rest of the input is: 0 a vocab.json (with a fixed merges.txt), 1 a merges.txt
// (with a fixed vocab.json), else text encoded by a small valid tokenizer. Files must load or be refused with an
// error, never crash or hang; any text must encode, and well-formed UTF-8 decode back to itself.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <unordered_map>

#include "config/errors.h"
#include "data/byte_level.h"
#include "data/gpt2_bpe.h"
#include "fuzz_file.h"

namespace {

const char* const kVocab = R"({"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5, "\u0120a": 6, "!": 7, "1": 8, "<|endoftext|>": 9})";
const char* const kMerges = "#version: 0.2\na b\nab c\n\xC4\xA0 a\n";

std::string write(const std::string& name, const std::string& text) { return write_fuzz_file(name, text.data(), text.size()); }

// A vocabulary with every byte's symbol (ids 0-255) and the fixed merges' results: any text encodes.
std::string full_vocab() {
  std::string enc[256];
  std::unordered_map<uint32_t, uint8_t> dec;
  mt::byte_level_tables(enc, dec);
  std::string v = "{";
  for (int b = 0; b < 256; ++b) {
    std::string key;
    for (char ch : enc[b]) {
      if (ch == '"' || ch == '\\') key += '\\';
      key += ch;
    }
    v += "\"" + key + "\": " + std::to_string(b) + ", ";
  }
  return v + R"("ab": 256, "abc": 257, "\u0120a": 258, "<|endoftext|>": 259})";
}

// Well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF): such text decodes back to
// itself; other bytes are read as U+FFFD, as the reference (a JavaScript string) would hold them.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;  // continuation bytes
    if (n < 0) return false;
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k <= n; ++k) {
      if (i + static_cast<size_t>(k) >= s.size()) return false;
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t min[] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] == 0 || data[0] == 1) {
      const std::string vocab = write("vocab.json", data[0] == 0 ? rest : kVocab);
      const std::string merges = write("merges.txt", data[0] == 1 ? rest : kMerges);
      mt::Gpt2BpeTokenizer tok(vocab, merges);
      (void)tok.decode(tok.encode("abc ab a! 1"));
      return 0;
    }
    static const mt::Gpt2BpeTokenizer tok(write("full-vocab.json", full_vocab()), write("merges.txt", kMerges));
    const auto ids = tok.encode(rest);  // every byte has its symbol: any text encodes
    if (valid_utf8(rest) && tok.decode(ids) != rest) std::abort();  // and well-formed text decodes back to itself
  } catch (const std::runtime_error&) {  // ConfigError included
  }
  return 0;
}
