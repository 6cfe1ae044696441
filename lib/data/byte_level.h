// byte_level.h: the pieces GPT-2-style byte-level BPE tokenizers share: UTF-8 encoding of a code point and
// GPT-2's bytes_to_unicode table (printable bytes stand for themselves, the others for 256 + n).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

namespace mt {

void append_utf8(std::string& out, uint32_t cp);

// enc[b]: the UTF-8 of byte b's stand-in character; dec: stand-in code point -> byte.
void byte_level_tables(std::string (&enc)[256], std::unordered_map<uint32_t, uint8_t>& dec);

}  // namespace mt
