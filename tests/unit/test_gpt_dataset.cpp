// test_gpt_dataset.cpp: GPT dataset indices (samples of seq+1 overlapping by one, epochs, seeded
// shuffles), Megatron's split and blending, the index cache, and training on .bin/.idx data.
#include <filesystem>
#include <map>
#include <set>

#include "catch.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "train/train_common.h"
#include "train/trainer.h"

using namespace mt;
namespace fs = std::filesystem;

namespace {

// Documents d = 0..n-1 of length 3 + d % 5 whose tokens encode (document, position); with
// counting=true, every document counts 10, 11, ... instead (learnable).
std::string make_corpus(const fs::path& dir, const std::string& name, int n, int base, bool counting = false) {
  fs::create_directories(dir);
  const std::string prefix = (dir / name).string();
  IndexedDatasetWriter w(prefix, 8);
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> t;
    for (int k = 0; k < 3 + d % 5; ++k) t.push_back(counting ? 10 + k : base + d * 8 + k);
    w.add_document(t);
  }
  w.finalize();
  return prefix;
}

Config data_config(const std::string& path_spec, int64_t iters) {
  Config c;
  c.data.seq_length = 8;
  c.data.data_path = {path_spec};
  c.training.seed = 5;
  c.training.train_iters = iters;
  c.training.micro_batch_size = 2;
  c.logging.eval_iters = 2;
  c.logging.eval_interval = 10;
  c.derived.global_batch_size = 4;
  return c;
}

}  // namespace

TEST_CASE("sample index: seq+1 tokens overlapping by one, whole epochs, deterministic shuffle") {
  const fs::path dir = fs::temp_directory_path() / "megatrain_gpt_ds";
  fs::remove_all(dir);
  const std::string prefix = make_corpus(dir, "a", 20, 0);
  auto data = std::make_shared<const IndexedDataset>(prefix);
  int64_t tokens = 0;
  for (int d = 0; d < 20; ++d) tokens += data->sequence_length(d);  // 100
  GptSplitIndex idx(data, 0, 20, 30, 8, 1, (dir / "cache").string(), "train");
  CHECK(idx.epochs() == 3);  // 30 samples x 8 + 1 > 2 epochs of 100 tokens
  CHECK(idx.num_samples() == (3 * tokens - 1) / 8);
  CHECK_FALSE(idx.loaded_from_cache());
  // Every token of an epoch appears; samples are seq+1 long; each epoch visits each document once.
  std::map<int32_t, int> seen;
  std::vector<int32_t> s(9);
  for (int64_t i = 0; i < idx.num_samples(); ++i) {
    idx.sample(i, s.data());
    for (int k = 0; k < 8; ++k) seen[s[static_cast<size_t>(k)]]++;
  }
  CHECK(static_cast<int64_t>(seen.size()) == tokens);
  GptSplitIndex again(data, 0, 20, 30, 8, 1, (dir / "cache").string(), "train");
  CHECK(again.loaded_from_cache());
  std::vector<int32_t> s2(9);
  for (int64_t i = 0; i < idx.num_samples(); ++i) {
    idx.sample(i, s.data());
    again.sample(i, s2.data());
    CHECK(s == s2);
  }
  GptSplitIndex other_seed(data, 0, 20, 30, 8, 2, (dir / "cache").string(), "train");
  int differ = 0;
  for (int64_t i = 0; i < 5; ++i) {
    idx.sample(i, s.data());
    other_seed.sample(i, s2.data());
    differ += s != s2;
  }
  CHECK(differ > 0);
  fs::remove_all(dir);
}

TEST_CASE("split ranges and blending by weight") {
  const fs::path dir = fs::temp_directory_path() / "megatrain_gpt_blend";
  fs::remove_all(dir);
  const std::string a = make_corpus(dir, "a", 100, 0), b = make_corpus(dir, "b", 100, 2000);
  Config c = data_config("", 50);
  c.data.data_path = {"0.25", a, "0.75", b};
  c.data.split = "80,10,10";
  const int64_t samples[3] = {200, 16, 8};
  GptDataset ds(c, 50257, 50256, samples);
  CHECK(ds.has_split(Split::kValid));
  int from_a = 0;
  std::vector<int32_t> s(9);
  std::set<int32_t> train_docs, valid_docs;
  for (int64_t i = 0; i < 200; ++i) {
    ds.sample(Split::kTrain, i, 9, s.data());
    from_a += s[0] < 2000;
    for (auto t : s) train_docs.insert(t % 2000 / 8);
  }
  CHECK(from_a == 50);  // greedy interleave hits the weights exactly
  for (int64_t i = 0; i < 16; ++i) {
    ds.sample(Split::kValid, i, 9, s.data());
    for (auto t : s) valid_docs.insert(t % 2000 / 8);
  }
  for (auto d : valid_docs) CHECK((d >= 80 && d < 90));  // documents 80..89 are the valid split
  for (auto d : train_docs) CHECK(d < 80);
  CHECK_THROWS_AS(parse_data_path({"0.5", a, b}), ConfigError);
  CHECK(parse_data_path({a}).front().first == 1.0);
  Config missing = data_config((dir / "nope").string(), 10);
  CHECK_THROWS_WITH(GptDataset(missing, 50257, 50256, samples), MT_CONTAINS("not found"));
  fs::remove_all(dir);
}

TEST_CASE("training on an indexed dataset: the loss falls and validation runs") {
  const fs::path dir = fs::temp_directory_path() / "megatrain_gpt_train";
  fs::remove_all(dir);
  const std::string a = make_corpus(dir, "a", 400, 0, true);
  Config c;
  c.model.num_layers = 1;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = 16;
  c.model.vocab_size = 64;
  c.data.tokenizer_type = "NullTokenizer";
  c.data.seq_length = 16;
  c.data.data_path = {a};
  c.data.split = "90,10,0";
  c.training.micro_batch_size = 4;
  c.training.train_iters = 30;
  c.training.lr = 3e-3;
  c.logging.eval_interval = 30;
  c.logging.eval_iters = 2;
  resolve(c, 1);
  const TrainResult r = train(c, ProcessGroups::single(), {true, 0});
  CHECK(r.valid_losses.size() == 2);  // (at iteration 30, and after the last iteration)
  CHECK(r.test_losses.empty());        // (--split 90,10,0: no test split)
  CHECK(r.losses.back() < r.losses.front() - 0.5);
  fs::remove_all(dir);
}

namespace {
// Documents of 7 tokens (the 7th is EOD), samples overlapping by one as GPT samples do.
struct ShortDocs final : TokenSource {
  void sample(Split, int64_t index, int64_t len, int32_t* out) const override {
    for (int64_t k = 0; k < len; ++k) out[k] = (index * 64 + k) % 7 == 6 ? eod() : static_cast<int32_t>((index * 64 + k) % 7 + 1);
  }
  int64_t vocab_size() const override { return 50; }
  int32_t eod() const override { return 49; }
  bool has_split(Split) const override { return true; }
  std::string describe() const override { return "short documents"; }
};
}  // namespace

TEST_CASE("--eod-mask-loss, --reset-position-ids and --reset-attention-mask follow the documents") {
  ShortDocs mock;
  Config c;
  c.data.eod_mask_loss = true;
  c.data.reset_position_ids = true;
  c.data.reset_attention_mask = true;
  const Microbatch mb = make_microbatch(mock, Split::kTrain, 0, 2, 64, c);
  int eods = 0;
  for (int64_t b = 0; b < 2; ++b) {
    int32_t expect_start = 0, expect_pos = 0;
    for (int64_t s = 0; s < 64; ++s) {
      const auto i = static_cast<size_t>(b * 64 + s);
      CHECK(mb.row_start[i] == expect_start);
      CHECK(mb.positions[i] == expect_pos++);
      CHECK(mb.rope_positions[i] == s);  // (RoPE's: the sequence's, as Megatron's rotary embedding of the sequence length)
      const bool eod = mb.tokens[i] == mock.eod();
      CHECK(mb.loss_mask[i] == (eod ? 0.0f : 1.0f));
      if (eod) {
        ++eods;
        expect_start = static_cast<int32_t>(s + 1);
        expect_pos = 0;
      }
    }
  }
  CHECK(eods > 0);
  CHECK(make_microbatch(mock, Split::kTrain, 0, 1, 64, Config{}).row_start.empty());
}

namespace {

// A one-layer model on mock data with NullTokenizer's --vocab-size 100, sequences of seq_length.
mt::Config null_tokenizer_mock_data(int64_t seq_length) {
  mt::Config c;
  c.model.num_layers = 1;
  c.model.hidden_size = 32;
  c.model.num_attention_heads = 4;
  c.model.vocab_size = 100;
  c.data.tokenizer_type = "NullTokenizer";
  c.data.mock_data = true;
  c.data.seq_length = seq_length;
  c.training.micro_batch_size = 2;
  return c;
}

}  // namespace

TEST_CASE("NullTokenizer is Megatron's: --vocab-size V ids and the end of document V, a vocabulary of V + 1") {
  const auto tok = mt::make_tokenizer("NullTokenizer", "", "", 100);
  CHECK(tok->vocab_size() == 101);
  CHECK(tok->eod() == 100);
  CHECK(tok->encode("3 17\n100") == std::vector<int32_t>{3, 17, 100});
  CHECK_THROWS_AS(tok->encode("101"), mt::ConfigError);
  // Padded as Megatron pads the tokenizer's vocabulary: 128256 + 1 -> 128384 (multiple of 128).
  CHECK(mt::padded_vocab_size(tok->vocab_size(), 128, 1) == 128);
  CHECK(mt::padded_vocab_size(mt::make_tokenizer("NullTokenizer", "", "", 128256)->vocab_size(), 128, 1) == 128384);
  // Mock data with NullTokenizer (the benchmark recipes): the model and the data agree on V + 1.
  mt::Config c = null_tokenizer_mock_data(16);
  mt::resolve(c, 1);
  CHECK(c.derived.vocab_size == 101);
  CHECK(mt::open_training_data(c)->vocab_size() == 101);
}

TEST_CASE("Megatron's tokenizer settings: NullTokenizer's end-of-document and padding ids, the embedding's rows as given") {
  // --null-tokenizer-eod-id: the tokenizer's and the mock data's end of document.
  CHECK(mt::make_tokenizer("NullTokenizer", "", "", 100, "", 7)->eod() == 7);
  mt::Config c = null_tokenizer_mock_data(64);
  c.data.null_tokenizer_eod_id = 7;
  mt::resolve(c, 1);
  const auto mock = mt::open_training_data(c);
  CHECK(mock->eod() == 7);
  // --null-tokenizer-pad-id: labels equal to it take no loss, and it reads as 0 in tokens and labels (Megatron's GPT
  // dataset); mock documents count 1, 2, 3, ..., so id 5 stands in every document of 6 tokens or more.
  const Microbatch plain = make_microbatch(*mock, Split::kTrain, 0, 2, 64, c);
  c.data.null_tokenizer_pad_id = 5;
  const Microbatch padded = make_microbatch(*mock, Split::kTrain, 0, 2, 64, c);
  int masked = 0;
  for (size_t i = 0; i < plain.tokens.size(); ++i) {
    const bool pad_label = plain.labels[i] == 5;
    masked += pad_label ? 1 : 0;
    CHECK(padded.loss_mask[i] == (pad_label ? 0.0f : plain.loss_mask[i]));
    CHECK(padded.labels[i] == (pad_label ? 0 : plain.labels[i]));
    CHECK(padded.tokens[i] == (plain.tokens[i] == 5 ? 0 : plain.tokens[i]));
  }
  CHECK(masked > 0);
  // A padding id equal to the end of document is none (Megatron resets one that collides with a special token).
  c.data.null_tokenizer_pad_id = 7;
  const Microbatch colliding = make_microbatch(*mock, Split::kTrain, 0, 2, 64, c);
  CHECK(colliding.tokens == plain.tokens);
  CHECK(colliding.loss_mask == plain.loss_mask);
  c.data.allow_ambiguous_pad_tokens = true;  // (Megatron's opt-in: the end of document's labels then take no loss)
  const Microbatch ambiguous = make_microbatch(*mock, Split::kTrain, 0, 2, 64, c);
  for (size_t i = 0; i < plain.tokens.size(); ++i) CHECK(ambiguous.loss_mask[i] == (plain.labels[i] == 7 ? 0.0f : 1.0f));
  c.data.allow_ambiguous_pad_tokens = false;
  // --padded-vocab-size as given, --no-pad-vocab-size the vocabulary itself; either checked against it and TP.
  mt::Config rows = c;
  rows.data.null_tokenizer_pad_id = -1;
  rows.model.padded_vocab_size = 104;
  mt::resolve(rows, 1);
  CHECK(rows.derived.padded_vocab_size == 104);
  CHECK(mt::validate_vocabulary(rows).ok());
  rows.model.padded_vocab_size = 100;  // (below the 101 ids)
  mt::resolve(rows, 1);
  CHECK_FALSE(mt::validate_vocabulary(rows).ok());
  rows.model.padded_vocab_size.reset();
  rows.model.no_pad_vocab_size = true;
  mt::resolve(rows, 1);
  CHECK(rows.derived.padded_vocab_size == 101);
  CHECK(mt::validate_vocabulary(rows).ok());
  rows.parallel.tensor_model_parallel_size = 2;  // (101 rows do not split over TP 2)
  mt::resolve(rows, 2);
  CHECK_FALSE(mt::validate_vocabulary(rows).ok());
}
