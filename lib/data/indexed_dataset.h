// indexed_dataset.h: Megatron's .bin/.idx token files (shared/REFERENCE.md section 4). The reader maps
// both files and checks every header field, length, pointer and document index against the file
// sizes before use: a truncated or corrupt file is an error naming the file and the problem, never an
// out-of-bounds read. The writer produces the files Megatron's preprocess_data.py writes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace mt {

// dtype codes: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16.
size_t indexed_dtype_size(uint8_t code);
// uint16 when every id fits (vocab < 65500, as Megatron), else int32.
uint8_t indexed_dtype_for_vocab(int64_t vocab_size);

class IndexedDataset {
 public:
  // prefix: path without .bin/.idx. Throws DataError on any inconsistency.
  explicit IndexedDataset(const std::string& prefix);
  // In-memory variant (fuzzing, tests): the two files' contents.
  IndexedDataset(const std::string& name, std::string idx_bytes, std::string bin_bytes);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  int64_t num_sequences() const { return static_cast<int64_t>(seq_count_); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_count_) - 1; }
  int32_t sequence_length(int64_t i) const { return load_i32(sizes_ + 4 * i); }
  // Sequences of document d: [doc_index(d), doc_index(d + 1)).
  int64_t document_index(int64_t d) const { return load_i64(doc_idx_ + 8 * d); }
  uint8_t dtype() const { return dtype_; }
  // Tokens [offset, offset + n) of sequence i, widened to int32 (bounds were checked at open).
  void read(int64_t i, int64_t offset, int64_t n, int32_t* out) const;
  const std::string& name() const { return name_; }

 private:
  void parse();
  std::string name_;
  const char* idx_ = nullptr;
  size_t idx_size_ = 0;
  const char* bin_ = nullptr;
  size_t bin_size_ = 0;
  void* idx_map_ = nullptr;
  void* bin_map_ = nullptr;
  std::string idx_owned_, bin_owned_;
  uint8_t dtype_ = 0;
  uint64_t seq_count_ = 0, doc_count_ = 0;
  // The arrays sit at unaligned file offsets (34 + ...): read through memcpy.
  const char* sizes_ = nullptr;
  const char* pointers_ = nullptr;
  const char* doc_idx_ = nullptr;
  static int32_t load_i32(const char* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
  static int64_t load_i64(const char* p) { int64_t v; std::memcpy(&v, p, 8); return v; }
  int64_t pointer(int64_t i) const { return load_i64(pointers_ + 8 * i); }
};

class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, uint8_t dtype_code);
  ~IndexedDatasetWriter();
  // One document = one sequence (Megatron without sentence splitting).
  void add_document(const std::vector<int32_t>& tokens);
  // Writes the .idx; the .bin is complete afterwards. Files appear under their names only when whole.
  void finalize();

 private:
  std::string prefix_;
  uint8_t dtype_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  int64_t offset_ = 0;
  bool done_ = false;
};

}  // namespace mt
