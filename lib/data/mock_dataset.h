// mock_dataset.h: Megatron's mock data: documents of random length in [1, 4096) whose tokens count
// 1, 2, ..., len-1 and end with EOD; learnable, so the loss falls. Ids wrap below the vocabulary.
#pragma once

#include <mutex>
#include <vector>

#include "data/token_source.h"

namespace mt {

class MockDataset final : public TokenSource {
 public:
  // eod: the end-of-document id (-1: vocab - 1, the last id; --null-tokenizer-eod-id sets another).
  MockDataset(int64_t vocab, uint64_t seed, int64_t seq_length, int32_t eod = -1);
  void sample(Split split, int64_t index, int64_t len, int32_t* out) const override;
  int64_t vocab_size() const override { return vocab_; }
  int32_t eod() const override { return eod_; }
  bool has_split(Split) const override { return true; }
  std::string describe() const override;

 private:
  int64_t doc_length(Split split, int64_t doc) const;
  int64_t vocab_;
  uint64_t seed_;
  int64_t seq_;
  int32_t eod_;
  // Per split: document start offsets in the token stream, extended on demand.
  mutable std::mutex mu_;
  mutable std::vector<int64_t> starts_[3];
};

}  // namespace mt
