// mock_dataset.cpp: a deterministic stream of mock documents per split.
#include "data/mock_dataset.h"

#include <algorithm>

#include "tensor/rng.h"

namespace mt {

MockDataset::MockDataset(int64_t vocab, uint64_t seed, int64_t seq_length, int32_t eod)
    : vocab_(vocab), seed_(seed), seq_(seq_length), eod_(eod >= 0 ? eod : static_cast<int32_t>(vocab - 1)) {
  for (auto& s : starts_) s.push_back(0);
}

std::string MockDataset::describe() const {
  return "mock data (Megatron's: documents of 1..4095 counting tokens, vocab " + std::to_string(vocab_) + ")";
}

int64_t MockDataset::doc_length(Split split, int64_t doc) const {
  const uint64_t key = rng_key(seed_, "mock-data");
  const float u = philox_uniform(key, static_cast<uint64_t>(doc), static_cast<uint64_t>(split));
  return 1 + std::min<int64_t>(4094, static_cast<int64_t>(u * 4095.0f));
}

void MockDataset::sample(Split split, int64_t index, int64_t len, int32_t* out) const {
  const int64_t begin = index * seq_;  // consecutive samples overlap by one token
  const int64_t end = begin + len;
  std::vector<int64_t> starts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& st = starts_[static_cast<int>(split)];
    while (st.back() < end) st.push_back(st.back() + doc_length(split, static_cast<int64_t>(st.size()) - 1));
    starts = st;  // small copy keeps the lookup lock-free below
  }
  int64_t doc = static_cast<int64_t>(std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin()) - 1;
  for (int64_t pos = begin; pos < end; ++pos) {
    while (pos >= starts[static_cast<size_t>(doc + 1)]) ++doc;
    const int64_t in_doc = pos - starts[static_cast<size_t>(doc)];
    const int64_t doc_len = starts[static_cast<size_t>(doc + 1)] - starts[static_cast<size_t>(doc)];
    int32_t tok;
    if (in_doc == doc_len - 1) tok = eod();
    else tok = static_cast<int32_t>(1 + in_doc % std::max<int64_t>(1, vocab_ - 2));
    out[pos - begin] = tok;
  }
}

}  // namespace mt
