// gpt_dataset.h: Megatron's GPT dataset over .bin/.idx files. For each split (contiguous document
// ranges by --split, or the separate --train/valid/test-data-path): a document index (document ids
// tiled over the epochs needed and shuffled), a sample index (samples of seq+1 tokens, consecutive
// samples overlapping by one) and a shuffle index, all seeded. Built the same way on every rank (no
// shared filesystem needed) and cached under --data-cache-path (default: beside the data). Several
// datasets blend by weight with Megatron's greedy interleave.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/token_source.h"

namespace mt {

// One indexed dataset restricted to documents [doc_begin, doc_end), indexed for num_samples samples.
class GptSplitIndex {
 public:
  GptSplitIndex(std::shared_ptr<const IndexedDataset> data, int64_t doc_begin, int64_t doc_end, int64_t num_samples,
                int64_t seq_length, uint64_t seed, const std::string& cache_dir, const std::string& split_name);
  int64_t num_samples() const { return static_cast<int64_t>(shuffle_.size()); }
  int64_t epochs() const { return epochs_; }
  bool loaded_from_cache() const { return from_cache_; }
  // Tokens of sample i (seq_length + 1 of them).
  void sample(int64_t i, int32_t* out) const;

 private:
  void build(int64_t doc_begin, int64_t doc_end, uint64_t seed);
  std::shared_ptr<const IndexedDataset> data_;
  int64_t seq_;
  int64_t epochs_ = 0;
  bool from_cache_ = false;
  // Empty when the indices read from a cache point inside the split and agree with each other; else why not.
  std::string check_cached(int64_t doc_begin, int64_t doc_end, int64_t num_samples) const;
  std::vector<int32_t> doc_index_;       // document (sequence) ids, epochs concatenated, shuffled
  std::vector<int64_t> sample_index_;    // pairs (position in doc_index_, token offset), num_samples + 1 of them
  std::vector<int64_t> shuffle_;
};

class GptDataset final : public TokenSource {
 public:
  // num_samples: what training (and evaluation) will ask of each split.
  GptDataset(const Config& cfg, int64_t vocab_size, int32_t eod, const int64_t num_samples[3]);
  void sample(Split split, int64_t index, int64_t len, int32_t* out) const override;
  int64_t vocab_size() const override { return vocab_; }
  int32_t eod() const override { return eod_; }
  bool has_split(Split split) const override;
  std::string describe() const override { return describe_; }

 private:
  struct Part {
    double weight;
    std::unique_ptr<GptSplitIndex> index;
  };
  struct Blend {
    std::vector<Part> parts;
    std::vector<uint16_t> which;     // dataset of blended sample i
    std::vector<int64_t> which_sample;
  };
  Blend blends_[3];
  int64_t vocab_;
  int32_t eod_;
  int64_t seq_;
  std::string describe_;
};

// "prefix" or "w1 prefix1 w2 prefix2 ..." -> (weight, prefix) with weights normalised.
std::vector<std::pair<double, std::string>> parse_data_path(const StringList& items);

}  // namespace mt
