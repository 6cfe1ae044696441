// test_indexed_dataset.cpp: Megatron's .bin/.idx layout byte for byte, reading back, and every kind of
// corrupt file refused with a message (never an out-of-bounds read).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catch.h"
#include "config/errors.h"
#include "data/indexed_dataset.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Two documents [1, 2, 3] and [65535, 7] as uint16, worked out by hand from REFERENCE.md section 4.
std::string expected_idx() {
  std::string s("MMIDIDX\0\0", 9);
  put<uint64_t>(s, 1);          // version
  put<uint8_t>(s, 8);           // dtype uint16
  put<uint64_t>(s, 2);          // sequences
  put<uint64_t>(s, 3);          // document index entries
  put<int32_t>(s, 3);
  put<int32_t>(s, 2);           // lengths
  put<int64_t>(s, 0);
  put<int64_t>(s, 6);           // byte pointers
  put<int64_t>(s, 0);
  put<int64_t>(s, 1);
  put<int64_t>(s, 2);           // document index
  return s;
}

std::string error_of(const std::string& idx, const std::string& bin) {
  try {
    IndexedDataset d("corrupt", idx, bin);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("writer output matches Megatron's layout byte for byte, and reads back") {
  const fs::path dir = fs::temp_directory_path() / "megatrain_idx_test";
  fs::create_directories(dir);
  const std::string prefix = (dir / "doc").string();
  {
    IndexedDatasetWriter w(prefix, 8);
    w.add_document({1, 2, 3});
    w.add_document({65535, 7});
    w.finalize();
  }
  CHECK(slurp(prefix + ".idx") == expected_idx());
  CHECK(slurp(prefix + ".bin") == std::string("\x01\x00\x02\x00\x03\x00\xff\xff\x07\x00", 10));
  IndexedDataset d(prefix);
  CHECK(d.num_sequences() == 2);
  CHECK(d.num_documents() == 2);
  CHECK(d.sequence_length(1) == 2);
  int32_t out[3];
  d.read(0, 0, 3, out);
  CHECK((out[0] == 1 && out[1] == 2 && out[2] == 3));
  d.read(1, 0, 2, out);
  CHECK((out[0] == 65535 && out[1] == 7));
  CHECK_THROWS_AS(d.read(1, 1, 2, out), DataError);
  // int32 files (large vocabularies) too.
  {
    IndexedDatasetWriter w(prefix + "32", 4);
    w.add_document({100000, -1 + 1, 128255});
    w.finalize();
  }
  IndexedDataset d32(prefix + "32");
  d32.read(0, 0, 3, out);
  CHECK((out[0] == 100000 && out[2] == 128255 && d32.dtype() == 4));
  CHECK(indexed_dtype_for_vocab(50257) == 8);
  CHECK(indexed_dtype_for_vocab(128256) == 4);
  fs::remove_all(dir);
}

TEST_CASE("files in Megatron's layout with other dtypes and multi-sequence documents read back") {
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 5);  // int64 tokens
  put<uint64_t>(idx, 3);
  put<uint64_t>(idx, 2);  // one document of three sequences
  for (int32_t n : {1, 2, 1}) put<int32_t>(idx, n);
  for (int64_t p : {0, 8, 24}) put<int64_t>(idx, p);
  put<int64_t>(idx, 0);
  put<int64_t>(idx, 3);
  std::string bin;
  for (int64_t t : {5, 6, 7, 8}) put<int64_t>(bin, t);
  IndexedDataset d("mem", idx, bin);
  CHECK(d.num_documents() == 1);
  CHECK(d.document_index(1) == 3);
  int32_t out[2];
  d.read(1, 0, 2, out);
  CHECK((out[0] == 6 && out[1] == 7));
}

TEST_CASE("corrupt files are refused with a message naming the file and the problem") {
  const std::string idx = expected_idx(), bin("\x01\x00\x02\x00\x03\x00\xff\xff\x07\x00", 10);
  CHECK(error_of(idx, bin).empty());
  CHECK(error_of(idx.substr(0, 20), bin).find("corrupt.idx: truncated header") == 0);
  std::string magic = idx;
  magic[0] = 'X';
  CHECK(error_of(magic, bin).find("bad magic") != std::string::npos);
  std::string version = idx;
  version[9] = 2;
  CHECK(error_of(version, bin).find("unsupported version 2") != std::string::npos);
  std::string dtype = idx;
  dtype[17] = 9;
  CHECK(error_of(dtype, bin).find("unknown dtype code 9") != std::string::npos);
  CHECK(error_of(idx.substr(0, idx.size() - 8), bin).find("corrupt.idx: document count 3 exceeds the file") == 0);
  CHECK(error_of(idx + "xxxx", bin).find("does not match its counts") != std::string::npos);
  std::string huge = idx;
  const uint64_t big = 1ull << 62;
  std::memcpy(&huge[18], &big, 8);
  CHECK(error_of(huge, bin).find("sequence count") != std::string::npos);
  CHECK(error_of(idx, bin.substr(0, 8)).find("corrupt.bin: sequence 1") != std::string::npos);  // truncated .bin
  std::string ptr = idx;
  const int64_t far = 1000;
  std::memcpy(&ptr[34 + 8 + 8], &far, 8);
  CHECK(error_of(ptr, bin).find("lies outside") != std::string::npos);
  std::string len = idx;
  const int32_t neg = -5;
  std::memcpy(&len[34], &neg, 4);
  CHECK(error_of(len, bin).find("negative length") != std::string::npos);
  std::string docs = idx;
  const int64_t bad = 7;
  std::memcpy(&docs[34 + 8 + 16 + 8], &bad, 8);
  CHECK(error_of(docs, bin).find("document index entry 1") != std::string::npos);
  CHECK_THROWS_AS(IndexedDataset("/nonexistent/prefix"), DataError);
}
