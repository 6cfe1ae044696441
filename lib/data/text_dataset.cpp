// text_dataset.cpp: byte-level text data.
#include "data/text_dataset.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "config/errors.h"
#include "tensor/rng.h"

namespace mt {

std::vector<double> parse_split(const std::string& split) {
  std::string s = split;
  for (char& c : s) {
    if (c == ',' || c == '/') c = ' ';
  }
  std::istringstream in(s);
  std::vector<double> w;
  std::string tok;
  while (in >> tok) {
    char* end = nullptr;
    const double v = std::strtod(tok.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v) || v < 0) throw ConfigError("--split '" + split + "': weights must be non-negative numbers, e.g. 969,30,1");
    w.push_back(v);
  }
  while (w.size() < 3) w.push_back(0.0);
  if (w.size() > 3) throw ConfigError("--split '" + split + "' has more than 3 weights (train, valid, test)");
  const double sum = w[0] + w[1] + w[2];
  if (sum <= 0) throw ConfigError("--split '" + split + "' sums to zero");
  for (auto& x : w) x /= sum;
  return w;
}

TextByteDataset::TextByteDataset(const std::string& path, const std::string& split, uint64_t seed, int64_t seq)
    : path_(path), seed_(seed), seq_(seq) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot read --text-data-path '" + path + "': check the path");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const auto w = parse_split(split);
  const auto n = static_cast<int64_t>(bytes_.size());
  int64_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    begin_[i] = pos;
    pos = i == 2 ? n : pos + static_cast<int64_t>(static_cast<double>(n) * w[static_cast<size_t>(i)]);
    end_[i] = pos;
  }
  if (end_[0] - begin_[0] < seq + 1) {
    throw ConfigError("--text-data-path '" + path + "': the train split has " + std::to_string(end_[0] - begin_[0]) +
                      " bytes, fewer than --seq-length + 1 = " + std::to_string(seq + 1) + ": use a larger file or shorter sequences");
  }
}

bool TextByteDataset::has_split(Split split) const {
  const int i = static_cast<int>(split);
  return end_[i] - begin_[i] >= seq_ + 1;
}

std::string TextByteDataset::describe() const {
  return "bytes of " + path_ + " (" + std::to_string(bytes_.size()) + " bytes; train " + std::to_string(end_[0] - begin_[0]) +
         ", valid " + std::to_string(end_[1] - begin_[1]) + ", test " + std::to_string(end_[2] - begin_[2]) + ")";
}

void TextByteDataset::sample(Split split, int64_t index, int64_t len, int32_t* out) const {
  const int i = static_cast<int>(split);
  const int64_t span = end_[i] - begin_[i] - len;
  if (span < 0) throw ConfigError("text split too small for a sample of " + std::to_string(len) + " tokens");
  int64_t start;
  if (split == Split::kTrain) {
    const Philox4 r = philox4x32(static_cast<uint64_t>(index), 0, rng_key(seed_, "text-samples"));
    start = static_cast<int64_t>((static_cast<uint64_t>(r.v[0]) << 32 | r.v[1]) % static_cast<uint64_t>(span + 1));
  } else {
    start = (index * seq_) % (span + 1);
  }
  for (int64_t k = 0; k < len; ++k) out[k] = bytes_[static_cast<size_t>(begin_[i] + start + k)];
}

}  // namespace mt
