// gpt_dataset.cpp: index building, caching and blending.
#include "data/gpt_dataset.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <numeric>
#include <sstream>

#include "config/errors.h"
#include "data/text_dataset.h"
#include "tensor/rng.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

template <typename T>
void seeded_shuffle(std::vector<T>& v, uint64_t key) {
  for (size_t i = v.size(); i > 1; --i) {
    const Philox4 r = philox4x32(i, 0, key);
    const uint64_t x = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    std::swap(v[i - 1], v[x % i]);
  }
}

// An index cache file: a header (magic and format, the key of what it indexes, the element count, a checksum
// of the content), then the elements. Anything that does not match is rebuilt, never trusted.
constexpr uint64_t kCacheMagic = 0x3258444958544d00ull;  // "\0MTXIDX2"
struct CacheHeader {
  uint64_t magic = kCacheMagic, key = 0, count = 0, checksum = 0;
};

uint64_t fnv_bytes(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Empty when `p` held a valid cache of `key` (into v); else why not ("absent" when there is no file).
template <typename T>
std::string read_vec(const fs::path& p, std::vector<T>& v, uint64_t key, size_t expect) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return "absent";
  in.seekg(0, std::ios::end);
  const auto bytes = static_cast<size_t>(in.tellg());
  in.seekg(0);
  CacheHeader h;
  if (bytes < sizeof(h) || !in.read(reinterpret_cast<char*>(&h), sizeof(h)) || h.magic != kCacheMagic) return "not a megatrain index cache of this version";
  if (h.key != key) return "built for other data or settings";
  if (h.count != (bytes - sizeof(h)) / sizeof(T) || (bytes - sizeof(h)) % sizeof(T) != 0 || (expect && h.count != expect)) return "truncated or of the wrong size";
  v.resize(static_cast<size_t>(h.count));
  if (!in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)))) return "unreadable";
  if (fnv_bytes(v.data(), v.size() * sizeof(T)) != h.checksum) return "its content does not match its checksum";
  return {};
}

template <typename T>
void write_vec_atomic(const fs::path& p, const std::vector<T>& v, uint64_t key) {
  const fs::path tmp = p.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;  // the cache is an optimisation: an unwritable directory only costs a rebuild
    CacheHeader h;
    h.key = key;
    h.count = v.size();
    h.checksum = fnv_bytes(v.data(), v.size() * sizeof(T));
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
}

// The .idx file's content and the .bin file's size and time: a dataset rewritten in place with the same sizes
// is other data.
std::string dataset_identity(const std::string& prefix) {
  std::ifstream in(prefix + ".idx", std::ios::binary);
  const std::string idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::error_code ec;
  const auto bin_time = fs::last_write_time(prefix + ".bin", ec).time_since_epoch().count();
  return std::to_string(fnv_bytes(idx.data(), idx.size())) + "|" + std::to_string(fs::file_size(prefix + ".bin")) + "|" + std::to_string(bin_time);
}

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

GptSplitIndex::GptSplitIndex(std::shared_ptr<const IndexedDataset> data, int64_t doc_begin, int64_t doc_end, int64_t num_samples,
                             int64_t seq, uint64_t seed, const std::string& cache_dir, const std::string& split_name)
    : data_(std::move(data)), seq_(seq) {
  int64_t tokens = 0;
  for (int64_t d = doc_begin; d < doc_end; ++d) tokens += data_->sequence_length(d);
  if (tokens <= seq) {
    throw DataError(data_->name() + ": the " + split_name + " split holds " + std::to_string(tokens) + " tokens, not enough for one sample of " +
                    std::to_string(seq + 1) + ": adjust --split or use more data");
  }
  // Smallest number of epochs whose tokens cover num_samples samples of seq (+1 overlapping token).
  epochs_ = std::max<int64_t>(1, (num_samples * seq + 1 + tokens - 1) / tokens);
  while ((epochs_ * tokens - 1) / seq < num_samples) ++epochs_;
  // The order of the samples depends on the data and the settings only (the same on every rank and node): the
  // dataset's name (not its directory, so a run resumed after the data moved, to local disk say, continues in the
  // same order) and sizes; the cache's key adds what tells a dataset rewritten in place.
  std::ostringstream order_key;
  order_key << fs::path(data_->name()).filename().string() << '|' << fs::file_size(data_->name() + ".idx") << '|'
            << fs::file_size(data_->name() + ".bin")
            << '|' << doc_begin << '|' << doc_end << '|' << num_samples << '|' << seq << '|' << seed << "|v1";
  const uint64_t order = fnv(order_key.str());
  const uint64_t h = fnv(order_key.str() + "|" + dataset_identity(data_->name()) + "|v2");
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  const fs::path dir = cache_dir.empty() ? fs::path(data_->name()).parent_path() : fs::path(cache_dir);
  const std::string stem = fs::path(data_->name()).filename().string() + "-" + split_name + "-" + hex;
  const fs::path p_doc = dir / (stem + "-doc.bin"), p_sample = dir / (stem + "-sample.bin"), p_shuf = dir / (stem + "-shuffle.bin");
  std::string why = read_vec(p_doc, doc_index_, h, static_cast<size_t>(epochs_ * (doc_end - doc_begin)));
  if (why.empty()) why = read_vec(p_sample, sample_index_, h, 0);
  if (why.empty()) why = read_vec(p_shuf, shuffle_, h, 0);
  if (why.empty()) why = check_cached(doc_begin, doc_end, num_samples);
  if (why.empty()) {
    from_cache_ = true;
    return;
  }
  if (why != "absent") std::cerr << "megatrain: note: rebuilding the index cache " << (dir / stem).string() << "-*: " << why << "\n";
  doc_index_.clear();
  sample_index_.clear();
  shuffle_.clear();
  build(doc_begin, doc_end, seed ^ order);
  std::error_code ec;
  fs::create_directories(dir, ec);
  write_vec_atomic(p_doc, doc_index_, h);
  write_vec_atomic(p_sample, sample_index_, h);
  write_vec_atomic(p_shuf, shuffle_, h);
}

// The cached indices point inside the dataset (a checksum can match by chance; the reads must never leave it).
std::string GptSplitIndex::check_cached(int64_t doc_begin, int64_t doc_end, int64_t num_samples) const {
  if (sample_index_.size() != 2 * (shuffle_.size() + 1) || static_cast<int64_t>(shuffle_.size()) < num_samples) return "its parts do not agree";
  for (int32_t d : doc_index_) {
    if (d < doc_begin || d >= doc_end) return "a document outside the split";
  }
  // Every sample starts inside a document (the last pair only ends one, at most one past the documents).
  for (size_t i = 0; i < sample_index_.size(); i += 2) {
    const int64_t pos = sample_index_[i], off = sample_index_[i + 1];
    const bool end = i + 2 == sample_index_.size();
    const auto ndoc = static_cast<int64_t>(doc_index_.size());
    if (pos < 0 || off < 0 || pos > ndoc || (!end && pos == ndoc) ||
        (pos < ndoc && off > data_->sequence_length(doc_index_[static_cast<size_t>(pos)]))) {
      return "a sample outside the documents";
    }
    if (i >= 2 && (pos < sample_index_[i - 2] || (pos == sample_index_[i - 2] && off < sample_index_[i - 1]))) return "samples out of order";
  }
  for (auto x : shuffle_) {
    if (x < 0 || static_cast<size_t>(x) + 1 >= sample_index_.size() / 2) return "a shuffled sample out of range";
  }
  return {};
}

void GptSplitIndex::build(int64_t doc_begin, int64_t doc_end, uint64_t seed) {
  const int64_t ndocs = doc_end - doc_begin;
  doc_index_.resize(static_cast<size_t>(epochs_ * ndocs));
  for (int64_t e = 0; e < epochs_; ++e) {
    for (int64_t d = 0; d < ndocs; ++d) doc_index_[static_cast<size_t>(e * ndocs + d)] = static_cast<int32_t>(doc_begin + d);
  }
  seeded_shuffle(doc_index_, rng_key(seed, "document-index"));
  // Walk the shuffled documents: sample i starts seq tokens after sample i-1 (they share one token).
  int64_t total = 0;
  for (int32_t d : doc_index_) total += data_->sequence_length(d);
  const int64_t samples = (total - 1) / seq_;
  sample_index_.reserve(static_cast<size_t>(2 * (samples + 1)));
  int64_t pos = 0, off = 0;
  sample_index_.push_back(0);
  sample_index_.push_back(0);
  for (int64_t s = 0; s < samples; ++s) {
    int64_t remaining = seq_;
    while (remaining > 0) {
      const int64_t left = data_->sequence_length(doc_index_[static_cast<size_t>(pos)]) - off;
      if (left > remaining) {
        off += remaining;
        remaining = 0;
      } else {
        remaining -= left;
        ++pos;
        off = 0;
      }
    }
    sample_index_.push_back(pos);
    sample_index_.push_back(off);
  }
  shuffle_.resize(static_cast<size_t>(samples));
  std::iota(shuffle_.begin(), shuffle_.end(), 0);
  seeded_shuffle(shuffle_, rng_key(seed, "shuffle-index"));
}

void GptSplitIndex::sample(int64_t i, int32_t* out) const {
  const int64_t j = shuffle_[static_cast<size_t>(i % static_cast<int64_t>(shuffle_.size()))];
  int64_t pos = sample_index_[static_cast<size_t>(2 * j)], off = sample_index_[static_cast<size_t>(2 * j + 1)];
  int64_t need = seq_ + 1, w = 0;
  while (need > 0) {
    if (pos >= static_cast<int64_t>(doc_index_.size())) {
      throw DataError(data_->name() + ": sample " + std::to_string(j) + " runs past the documents of its index (a damaged index cache: delete it)");
    }
    const int32_t d = doc_index_[static_cast<size_t>(pos)];
    const int64_t take = std::min<int64_t>(need, data_->sequence_length(d) - off);
    data_->read(d, off, take, out + w);
    w += take;
    need -= take;
    ++pos;
    off = 0;
  }
}

std::vector<std::pair<double, std::string>> parse_data_path(const StringList& items) {
  std::vector<std::pair<double, std::string>> out;
  if (items.size() == 1) return {{1.0, items[0]}};
  if (items.size() % 2 != 0) throw ConfigError("--data-path: give one prefix, or weight/prefix pairs 'w1 p1 w2 p2 ...'");
  double sum = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    char* end = nullptr;
    const double w = std::strtod(items[i].c_str(), &end);
    if (*end != '\0' || !std::isfinite(w) || w < 0) throw ConfigError("--data-path: '" + items[i] + "' is not a weight (expected 'w1 p1 w2 p2 ...')");
    out.emplace_back(w, items[i + 1]);
    sum += w;
  }
  if (sum <= 0) throw ConfigError("--data-path: the weights sum to zero");
  for (auto& [w, p] : out) w /= sum;
  return out;
}

GptDataset::GptDataset(const Config& cfg, int64_t vocab, int32_t eod, const int64_t num_samples[3])
    : vocab_(vocab), eod_(eod), seq_(*cfg.data.seq_length) {
  const auto seed = static_cast<uint64_t>(cfg.training.seed);
  const std::string cache = cfg.data.data_cache_path.value_or("");
  const char* names[3] = {"train", "valid", "test"};
  std::map<std::string, std::shared_ptr<const IndexedDataset>> opened;
  auto open = [&](const std::string& prefix) {
    auto& d = opened[prefix];
    if (!d) {
      if (!fs::exists(prefix + ".idx") || !fs::exists(prefix + ".bin")) {
        throw DataError("dataset '" + prefix + "' not found: --data-path takes the prefix of PREFIX.bin / PREFIX.idx "
                        "(megatrain preprocess writes OUTPUT_text_document.{bin,idx})");
      }
      d = std::make_shared<const IndexedDataset>(prefix);
    }
    return d;
  };
  std::ostringstream desc;
  for (int s = 0; s < 3; ++s) {
    std::vector<std::pair<double, std::string>> sources;
    bool whole = false;
    const StringList& specific = s == 0 ? cfg.data.train_data_path : s == 1 ? cfg.data.valid_data_path : cfg.data.test_data_path;
    if (!specific.empty()) {
      sources = parse_data_path(specific);
      whole = true;
    } else if (!cfg.data.data_path.empty()) {
      sources = parse_data_path(cfg.data.data_path);
    }
    const int64_t target = num_samples[s];
    if (sources.empty() || target <= 0) continue;
    const auto w = parse_split(cfg.data.split);
    Blend& blend = blends_[s];
    for (const auto& [weight, prefix] : sources) {
      auto data = open(prefix);
      const int64_t n = data->num_sequences();
      int64_t b = 0, e = n;
      if (!whole) {
        // Megatron's split: rounded cumulative boundaries, the rounding error taken off the end.
        int64_t bounds[4] = {0, 0, 0, 0};
        for (int k = 0; k < 3; ++k) bounds[k + 1] = bounds[k] + static_cast<int64_t>(std::llround(w[static_cast<size_t>(k)] * static_cast<double>(n)));
        const int64_t diff = bounds[3] - n;
        for (int k = 1; k < 4; ++k) bounds[k] -= diff;
        b = std::max<int64_t>(0, bounds[s]);
        e = std::max<int64_t>(b, bounds[s + 1]);
      }
      if (e <= b) continue;
      const auto want = static_cast<int64_t>(std::ceil(static_cast<double>(target) * weight * 1.005));
      blend.parts.push_back({weight, std::make_unique<GptSplitIndex>(data, b, e, std::max<int64_t>(want, 1), seq_, seed, cache, names[s])});
      desc << (desc.tellp() > 0 ? "; " : "") << names[s] << ": " << prefix << " docs [" << b << ", " << e << ") x "
           << blend.parts.back().index->epochs() << " epoch(s)" << (blend.parts.back().index->loaded_from_cache() ? " (cached index)" : "");
    }
    if (blend.parts.empty()) continue;
    // Greedy interleave: the next sample comes from the dataset furthest behind its share.
    std::vector<int64_t> used(blend.parts.size(), 0);
    blend.which.resize(static_cast<size_t>(target));
    blend.which_sample.resize(static_cast<size_t>(target));
    for (int64_t i = 0; i < target; ++i) {
      size_t best = 0;
      double best_err = -1e300;
      for (size_t d = 0; d < blend.parts.size(); ++d) {
        const double err = blend.parts[d].weight * static_cast<double>(i + 1) - static_cast<double>(used[d]);
        if (err > best_err) {
          best_err = err;
          best = d;
        }
      }
      blend.which[static_cast<size_t>(i)] = static_cast<uint16_t>(best);
      blend.which_sample[static_cast<size_t>(i)] = used[best]++;
    }
  }
  if (blends_[0].parts.empty()) throw DataError("no training data: the train split of --data-path is empty (check --split)");
  describe_ = "Megatron indexed data (" + desc.str() + ")";
}

bool GptDataset::has_split(Split split) const { return !blends_[static_cast<int>(split)].parts.empty(); }

void GptDataset::sample(Split split, int64_t index, int64_t len, int32_t* out) const {
  const Blend& b = blends_[static_cast<int>(split)];
  if (b.parts.empty()) throw DataError("the requested split has no data");
  if (len != seq_ + 1) throw DataError("GPT samples are seq-length + 1 tokens");
  const auto i = static_cast<size_t>(index % static_cast<int64_t>(b.which.size()));
  b.parts[b.which[i]].index->sample(b.which_sample[i], out);
}

}  // namespace mt
