// tensorboard.cpp
#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "config/errors.h"

namespace mt {
namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol-buffer encoding of the few fields an Event of scalars needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void bytes_field(std::string& out, int field, const std::string& b) {
  key(out, field, 2);
  varint(out, b.size());
  out += b;
}
template <typename T>
void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64), as protobuf's wire format
  out.append(b, sizeof(T));
}

// Event { double wall_time = 1; int64 step = 2; ... }
std::string event_head(int64_t step) {
  std::string e;
  key(e, 1, 1);
  fixed(e, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (char ch : data) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(getpid()))).string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw ConfigError("cannot write the TensorBoard file " + path_ + ": check --tensorboard-dir");
  std::string e = event_head(0);
  bytes_field(e, 3, "brain.Event:2");  // string file_version = 3
  record(e);
  flush();
}

void TensorBoardWriter::record(const std::string& event) {
  std::string len;
  fixed(len, static_cast<uint64_t>(event.size()));
  std::string rec = len;
  fixed(rec, masked_crc32c(len));
  rec += event;
  fixed(rec, masked_crc32c(event));
  out_.write(rec.data(), static_cast<std::streamsize>(rec.size()));
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  std::string v;  // Summary.Value { string tag = 1; float simple_value = 2; }
  bytes_field(v, 1, tag);
  key(v, 2, 5);
  fixed(v, static_cast<float>(value));
  std::string summary;  // Summary { repeated Value value = 1; }
  bytes_field(summary, 1, v);
  std::string e = event_head(step);
  bytes_field(e, 5, summary);  // Summary summary = 5
  record(e);
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw std::runtime_error("writing the TensorBoard file " + path_ + " failed (disk full?)");
}

}  // namespace mt
