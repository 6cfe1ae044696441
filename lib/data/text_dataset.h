// text_dataset.h: a plain text file trained on as bytes (vocab 257: the 256 byte values and an end
// of document id 256). --split cuts it into contiguous train / valid / test ranges; training samples
// start at seeded random offsets of the train range, evaluation samples at fixed ones.
#pragma once

#include <string>
#include <vector>

#include "data/token_source.h"

namespace mt {

class TextByteDataset final : public TokenSource {
 public:
  TextByteDataset(const std::string& path, const std::string& split, uint64_t seed, int64_t seq_length);
  void sample(Split split, int64_t index, int64_t len, int32_t* out) const override;
  int64_t vocab_size() const override { return 257; }
  int32_t eod() const override { return 256; }
  bool has_split(Split split) const override;
  std::string describe() const override;

 private:
  std::string path_;
  std::vector<unsigned char> bytes_;
  int64_t begin_[3], end_[3];
  uint64_t seed_;
  int64_t seq_;
};

// "969,30,1" or "0.95 0.05 0" -> normalised weights; throws ConfigError on bad input.
std::vector<double> parse_split(const std::string& split);

}  // namespace mt
