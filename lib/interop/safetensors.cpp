// safetensors.cpp: the writer builds the header with nlohmann/json and writes through a temporary file; the
// reader maps the file and checks every offset before anything reads it.
#include "interop/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/errors.h"
#include "tensor/dtype.h"

namespace mt {
int64_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafeTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (static_cast<uint64_t>(n * safetensors_dtype_size(t.dtype)) != t.bytes.size()) {
      throw std::logic_error("safetensors: " + t.name + " holds " + std::to_string(t.bytes.size()) + " bytes, not its shape's");
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  struct RemoveOnFailure {
    const std::string& p;
    bool done = false;
    ~RemoveOnFailure() {
      if (!done) std::remove(p.c_str());
    }
  } cleanup{tmp};
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw DataError("cannot write " + tmp + ": check the directory exists and is writable");
    uint8_t len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const SafeTensor& t : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    out.flush();
    if (!out) throw DataError("writing " + tmp + " failed (disk full?)");
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw DataError("cannot sync " + tmp + " to disk: " + std::strerror(errno));
  }
  ::close(fd);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw DataError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  cleanup.done = true;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw DataError(path + " is not a safetensors file: shorter than its 8-byte header length");
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw DataError("cannot map " + path + ": " + std::strerror(errno));
  }
  try {
    parse_header();
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

void SafetensorsFile::parse_header() {
  const std::string& path = path_;
  const auto* base = static_cast<const uint8_t*>(map_);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(base[i]) << (8 * i);
  if (n > map_bytes_ - 8 || n > (100u << 20)) {
    throw DataError(path + " is not a safetensors file: its header length " + std::to_string(n) + " exceeds the file (" + std::to_string(map_bytes_) + " bytes)");
  }
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + n);
  } catch (const std::exception& e) {
    throw DataError(path + ": the safetensors header is not valid JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw DataError(path + ": the safetensors header is not a JSON object");
  data_ = base + 8 + n;
  const uint64_t data_bytes = map_bytes_ - 8 - n;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (v.is_object()) {
        for (const auto& [k, m] : v.items()) metadata_[k] = m.is_string() ? m.get<std::string>() : m.dump();
      }
      continue;
    }
    const std::string where = path + ": tensor " + name;
    try {
      Entry e;
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2) throw DataError(where + ": data_offsets must be [begin, end]");
      e.begin = off[0];
      e.end = off[1];
      const int64_t es = safetensors_dtype_size(e.dtype);
      if (es == 0) throw DataError(where + ": unknown dtype " + e.dtype);
      uint64_t count = 1;
      for (int64_t d : e.shape) {
        if (d < 0) throw DataError(where + ": negative dimension");
        if (d != 0 && count > data_bytes / static_cast<uint64_t>(d)) throw DataError(where + ": its shape holds more values than the file has bytes");
        count *= static_cast<uint64_t>(d);
      }
      if (e.end < e.begin || e.end > data_bytes) {
        throw DataError(where + ": bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") lie outside the file's " +
                        std::to_string(data_bytes) + " data bytes (truncated file?)");
      }
      if (e.end - e.begin != count * static_cast<uint64_t>(es)) {
        throw DataError(where + ": " + std::to_string(e.end - e.begin) + " bytes for " + std::to_string(count) + " " + e.dtype + " values");
      }
      spans.emplace_back(e.begin, e.end);
      entries_.emplace(name, std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      throw DataError(where + ": malformed header entry (" + ex.what() + ")");
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) throw DataError(path + ": two tensors' bytes overlap");
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw DataError(path_ + " has no tensor " + name);
  return it->second;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const Entry& e = entry(name);
  const uint8_t* p = data_ + e.begin;
  const size_t n = (e.end - e.begin) / static_cast<size_t>(safetensors_dtype_size(e.dtype));
  std::vector<float> out(n);
  if (e.dtype == "F32") {
    std::memcpy(out.data(), p, n * 4);
  } else if (e.dtype == "BF16" || e.dtype == "F16") {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = e.dtype == "BF16" ? bf16_to_float(h) : fp16_to_float(h);
    }
  } else {
    throw DataError(path_ + ": tensor " + name + " is " + e.dtype + ", not a floating-point type megatrain reads (F32, BF16, F16)");
  }
  return out;
}

std::vector<uint8_t> SafetensorsFile::read_u8_any(const std::string& name) const {
  const Entry& e = entry(name);
  if (safetensors_dtype_size(e.dtype) != 1) throw DataError(path_ + ": tensor " + name + " is " + e.dtype + ", not a one-byte type");
  return std::vector<uint8_t>(data_ + e.begin, data_ + e.end);
}

std::vector<uint8_t> SafetensorsFile::read_u8(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.dtype != "U8") throw DataError(path_ + ": tensor " + name + " is " + e.dtype + ", not U8");
  return std::vector<uint8_t>(data_ + e.begin, data_ + e.end);
}

}  // namespace mt
