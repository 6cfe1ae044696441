// safetensors.h: HuggingFace's safetensors format, read and written here: an 8-byte little-endian header
// length N, a JSON header of N bytes ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, padded with spaces to a multiple of 8), then the tensors' bytes back to back
// (offsets relative to the end of the header), row-major, little-endian.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mt {

struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Bytes per element of a safetensors dtype (0 for one megatrain does not know).
int64_t safetensors_dtype_size(const std::string& dtype);

// Writes the tensors (in the given order) and the metadata strings; the file appears whole (a temporary
// renamed into place) or not at all.
void write_safetensors(const std::string& path, const std::vector<SafeTensor>& tensors, const std::map<std::string, std::string>& metadata = {});

// A safetensors file opened for reading: the header parsed and checked (every tensor's offsets inside the
// file, its byte count matching dtype x shape, no overlaps); DataError naming the file and the tensor otherwise.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // in the data section
  };
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const Entry& entry(const std::string& name) const;
  // The tensor's values as fp32 (from F32, BF16 or F16).
  std::vector<float> read_f32(const std::string& name) const;
  // The bytes of a U8 tensor (MXFP4's blocks and scales); DataError for another dtype.
  std::vector<uint8_t> read_u8(const std::string& name) const;
  // The bytes of any one-byte tensor (U8, I8, F8_E4M3, F8_E5M2) as stored.
  std::vector<uint8_t> read_u8_any(const std::string& name) const;

 private:
  void parse_header();
  std::string path_;
  const uint8_t* data_ = nullptr;  // the data section (memory-mapped)
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mt
