// byte_level.cpp: UTF-8 and GPT-2's bytes_to_unicode.
#include "data/byte_level.h"

#include <vector>

namespace mt {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

void byte_level_tables(std::string (&enc)[256], std::unordered_map<uint32_t, uint8_t>& dec) {
  std::vector<bool> printable(256, false);
  for (int b = '!'; b <= '~'; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[static_cast<size_t>(b)] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[static_cast<size_t>(b)] = true;
  uint32_t n = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t c = printable[b] ? b : 256 + n++;
    enc[b].clear();
    append_utf8(enc[b], c);
    dec[c] = static_cast<uint8_t>(b);
  }
}

}  // namespace mt
