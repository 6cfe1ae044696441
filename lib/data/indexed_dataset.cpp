// indexed_dataset.cpp: mmap reader with full validation, and the writer.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "config/errors.h"

namespace mt {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw DataError(file + ": " + what + " (re-run megatrain preprocess, or check the file was copied whole)");
}

void* map_file(const std::string& path, size_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError("cannot stat " + path);
  }
  *size = static_cast<size_t>(st.st_size);
  void* p = nullptr;
  if (*size > 0) {
    p = ::mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw DataError("cannot map " + path + ": " + std::strerror(errno));
    }
  }
  ::close(fd);
  return p;
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

size_t indexed_dtype_size(uint8_t code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: case 7: return 4;
    case 5: case 6: return 8;
    default: return 0;
  }
}

uint8_t indexed_dtype_for_vocab(int64_t vocab) { return vocab < 65500 ? 8 : 4; }

IndexedDataset::IndexedDataset(const std::string& prefix) : name_(prefix) {
  idx_map_ = map_file(prefix + ".idx", &idx_size_);
  try {
    bin_map_ = map_file(prefix + ".bin", &bin_size_);
  } catch (...) {
    if (idx_map_) ::munmap(idx_map_, idx_size_);
    throw;
  }
  idx_ = static_cast<const char*>(idx_map_);
  bin_ = static_cast<const char*>(bin_map_);
  try {
    parse();
  } catch (...) {
    if (idx_map_) ::munmap(idx_map_, idx_size_);
    if (bin_map_) ::munmap(bin_map_, bin_size_);
    throw;
  }
}

IndexedDataset::IndexedDataset(const std::string& name, std::string idx_bytes, std::string bin_bytes)
    : name_(name), idx_owned_(std::move(idx_bytes)), bin_owned_(std::move(bin_bytes)) {
  idx_ = idx_owned_.data();
  idx_size_ = idx_owned_.size();
  bin_ = bin_owned_.data();
  bin_size_ = bin_owned_.size();
  parse();
}

IndexedDataset::~IndexedDataset() {
  if (idx_map_) ::munmap(idx_map_, idx_size_);
  if (bin_map_) ::munmap(bin_map_, bin_size_);
}

void IndexedDataset::parse() {
  const std::string idx_name = name_ + ".idx", bin_name = name_ + ".bin";
  if (idx_size_ < kHeader) fail(idx_name, "truncated header: " + std::to_string(idx_size_) + " bytes, need " + std::to_string(kHeader));
  if (std::memcmp(idx_, kMagic, 9) != 0) fail(idx_name, "bad magic: not a Megatron MMIDIDX index");
  const auto version = load<uint64_t>(idx_ + 9);
  if (version != 1) fail(idx_name, "unsupported version " + std::to_string(version) + " (expected 1)");
  dtype_ = static_cast<uint8_t>(idx_[17]);
  const size_t elem = indexed_dtype_size(dtype_);
  if (elem == 0) fail(idx_name, "unknown dtype code " + std::to_string(dtype_));
  if (dtype_ == 6 || dtype_ == 7) fail(idx_name, "dtype code " + std::to_string(dtype_) + " is floating point, not token ids");
  seq_count_ = load<uint64_t>(idx_ + 18);
  doc_count_ = load<uint64_t>(idx_ + 26);
  // Exact size: header + int32[seq] + int64[seq] + int64[doc]; checked without overflow.
  const uint64_t room = idx_size_ - kHeader;
  if (seq_count_ > room / 12) fail(idx_name, "sequence count " + std::to_string(seq_count_) + " exceeds the file");
  if (doc_count_ > (room - seq_count_ * 12) / 8) fail(idx_name, "document count " + std::to_string(doc_count_) + " exceeds the file");
  const uint64_t expect = kHeader + seq_count_ * 12 + doc_count_ * 8;
  if (expect != idx_size_) {
    fail(idx_name, "size " + std::to_string(idx_size_) + " bytes does not match its counts (" + std::to_string(expect) + " expected)");
  }
  if (doc_count_ < 1) fail(idx_name, "no document index (count 0, expected at least the leading 0)");
  sizes_ = idx_ + kHeader;
  pointers_ = sizes_ + seq_count_ * 4;
  doc_idx_ = pointers_ + seq_count_ * 8;
  for (uint64_t i = 0; i < seq_count_; ++i) {
    const int64_t n = sequence_length(static_cast<int64_t>(i)), p = pointer(static_cast<int64_t>(i));
    if (n < 0) fail(idx_name, "sequence " + std::to_string(i) + " has negative length " + std::to_string(n));
    if (p < 0 || static_cast<uint64_t>(p) % elem != 0 || static_cast<uint64_t>(p) > bin_size_ ||
        static_cast<uint64_t>(n) * elem > bin_size_ - static_cast<uint64_t>(p)) {
      fail(bin_name, "sequence " + std::to_string(i) + " (" + std::to_string(n) + " tokens at byte " + std::to_string(p) +
                         ") lies outside the " + std::to_string(bin_size_) + "-byte file: truncated?");
    }
  }
  auto doc = [&](uint64_t d) { return document_index(static_cast<int64_t>(d)); };
  if (doc(0) != 0) fail(idx_name, "document index does not start at 0");
  for (uint64_t d = 1; d < doc_count_; ++d) {
    if (doc(d) < doc(d - 1) || static_cast<uint64_t>(doc(d)) > seq_count_) {
      fail(idx_name, "document index entry " + std::to_string(d) + " (" + std::to_string(doc(d)) + ") is out of order or past " +
                         std::to_string(seq_count_) + " sequences");
    }
  }
  if (static_cast<uint64_t>(doc(doc_count_ - 1)) != seq_count_) {
    fail(idx_name, "last document ends at sequence " + std::to_string(doc(doc_count_ - 1)) + ", not at " + std::to_string(seq_count_));
  }
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t n, int32_t* out) const {
  if (i < 0 || static_cast<uint64_t>(i) >= seq_count_ || offset < 0 || n < 0 || offset + n > sequence_length(i)) {
    throw DataError(name_ + ": read of tokens [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") of sequence " +
                    std::to_string(i) + " out of range");
  }
  const char* p = bin_ + pointer(i) + offset * static_cast<int64_t>(indexed_dtype_size(dtype_));
  for (int64_t k = 0; k < n; ++k) {
    switch (dtype_) {
      case 1: out[k] = static_cast<uint8_t>(p[k]); break;
      case 2: out[k] = static_cast<int8_t>(p[k]); break;
      case 3: out[k] = load<int16_t>(p + 2 * k); break;
      case 8: out[k] = load<uint16_t>(p + 2 * k); break;
      case 4: out[k] = load<int32_t>(p + 4 * k); break;
      default: out[k] = static_cast<int32_t>(load<int64_t>(p + 8 * k)); break;
    }
  }
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, uint8_t dtype) : prefix_(prefix), dtype_(dtype) {
  if (dtype != 8 && dtype != 4) throw DataError("the writer stores uint16 (8) or int32 (4) tokens");
  bin_ = std::fopen((prefix + ".bin.tmp").c_str(), "wb");
  if (!bin_) throw DataError("cannot write " + prefix + ".bin.tmp: " + std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!done_) {
    std::error_code ec;
    std::filesystem::remove(prefix_ + ".bin.tmp", ec);
  }
}

void IndexedDatasetWriter::add_document(const std::vector<int32_t>& tokens) {
  const size_t elem = indexed_dtype_size(dtype_);
  if (dtype_ == 8) {
    std::vector<uint16_t> buf(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] > 65535) throw DataError("token id " + std::to_string(tokens[i]) + " does not fit uint16");
      buf[i] = static_cast<uint16_t>(tokens[i]);
    }
    if (std::fwrite(buf.data(), 2, buf.size(), bin_) != buf.size()) throw DataError("write to " + prefix_ + ".bin failed (disk full?)");
  } else if (std::fwrite(tokens.data(), 4, tokens.size(), bin_) != tokens.size()) {
    throw DataError("write to " + prefix_ + ".bin failed (disk full?)");
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(offset_);
  offset_ += static_cast<int64_t>(tokens.size() * elem);
}

void IndexedDatasetWriter::finalize() {
  if (std::fflush(bin_) != 0 || std::fclose(bin_) != 0) throw DataError("closing " + prefix_ + ".bin failed");
  bin_ = nullptr;
  std::FILE* f = std::fopen((prefix_ + ".idx.tmp").c_str(), "wb");
  if (!f) throw DataError("cannot write " + prefix_ + ".idx.tmp");
  const uint64_t version = 1, seqs = sizes_.size(), docs = sizes_.size() + 1;
  bool ok = std::fwrite(kMagic, 1, 9, f) == 9 && std::fwrite(&version, 8, 1, f) == 1 && std::fwrite(&dtype_, 1, 1, f) == 1 &&
            std::fwrite(&seqs, 8, 1, f) == 1 && std::fwrite(&docs, 8, 1, f) == 1 &&
            std::fwrite(sizes_.data(), 4, seqs, f) == seqs && std::fwrite(pointers_.data(), 8, seqs, f) == seqs;
  for (uint64_t d = 0; d < docs && ok; ++d) {
    const int64_t v = static_cast<int64_t>(d);
    ok = std::fwrite(&v, 8, 1, f) == 1;
  }
  ok = ok && std::fclose(f) == 0;
  if (!ok) throw DataError("writing " + prefix_ + ".idx failed (disk full?)");
  std::filesystem::rename(prefix_ + ".bin.tmp", prefix_ + ".bin");
  std::filesystem::rename(prefix_ + ".idx.tmp", prefix_ + ".idx");
  done_ = true;
}

}  // namespace mt
