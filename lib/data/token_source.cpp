// token_source.cpp: choosing the data source from the flags, and cutting samples into microbatches.
#include "data/token_source.h"

#include "config/errors.h"
#include "data/gpt_dataset.h"
#include "data/mock_dataset.h"
#include "data/text_dataset.h"
#include "data/tokenizer.h"
#include "optim/batch_schedule.h"

namespace mt {

std::unique_ptr<TokenSource> make_token_source(const Config& cfg) {
  const int64_t seq = *cfg.data.seq_length;
  const auto seed = static_cast<uint64_t>(cfg.training.seed);
  if (cfg.data.text_data_path) return std::make_unique<TextByteDataset>(*cfg.data.text_data_path, cfg.data.split, seed, seq);
  if (cfg.data.mock_data) {
    if (!cfg.model.vocab_size) throw ConfigError("--mock-data needs --vocab-size (e.g. --vocab-size 50257)");
    if (*cfg.model.vocab_size < 3) throw ConfigError("--vocab-size must be at least 3 for mock data");
    // The tokenizer's vocabulary where resolve() knows it (NullTokenizer's is --vocab-size + 1: its end of document
    // is the extra id, as Megatron's mock dataset takes the tokenizer's), else --vocab-size.
    const bool null_tokenizer = cfg.data.tokenizer_type.value_or("") == "NullTokenizer";
    return std::make_unique<MockDataset>(cfg.derived.vocab_size > 0 ? cfg.derived.vocab_size : *cfg.model.vocab_size, seed, seq,
                                         null_tokenizer ? static_cast<int32_t>(cfg.data.null_tokenizer_eod_id.value_or(-1)) : -1);
  }
  if (!cfg.data.data_path.empty() || !cfg.data.train_data_path.empty()) {
    const auto tok = make_tokenizer(cfg);
    const BatchSchedule batches(cfg, 1);  // the global batch of each iteration (a ramp-up's too)
    const int64_t iters = cfg.training.train_iters ? *cfg.training.train_iters : batches.train_iterations(*cfg.training.train_samples);
    const int64_t eval_iters = cfg.logging.eval_iters;
    // (Megatron's: the validation split holds every evaluation's batches, each evaluation continuing where the last stopped,
    // one per --eval-interval and the final one; the test split one evaluation's)
    const int64_t egbs = cfg.derived.eval_global_batch_size;
    const int64_t samples[3] = {batches.samples_after(iters), (iters / cfg.logging.eval_interval + 1) * eval_iters * egbs, eval_iters * egbs};
    return std::make_unique<GptDataset>(cfg, tok->vocab_size(), tok->eod(), samples);
  }
  throw ConfigError("no data source: give --mock-data, --data-path or --text-data-path");
}

Microbatch make_microbatch(const TokenSource& src, Split split, int64_t first_sample, int64_t B, int64_t S,
                          const Config& cfg) {
  Microbatch mb;
  mb.B = B;
  mb.S = S;
  mb.first_sample = first_sample;
  const auto n = static_cast<size_t>(B * S);
  mb.tokens.resize(n);
  mb.labels.resize(n);
  mb.positions.resize(n);
  mb.loss_mask.assign(n, 1.0f);
  if (cfg.data.reset_attention_mask) mb.row_start.assign(n, 0);
  if (cfg.data.reset_position_ids) mb.rope_positions.assign(n, 0);
  std::vector<int32_t> buf(static_cast<size_t>(S + 1));
  const int32_t eod = src.eod();
  // Megatron's GPT dataset: labels equal to the padding id take no loss, and the id reads as 0 in tokens and labels (a
  // padding id equal to the end of document is no padding id, as Megatron resets one that collides, unless
  // --allow-ambiguous-pad-tokens).
  const int32_t pad = pad_token_id(cfg) == eod && !cfg.data.allow_ambiguous_pad_tokens ? -1 : pad_token_id(cfg);
  for (int64_t b = 0; b < B; ++b) {
    src.sample(split, first_sample + b, S + 1, buf.data());
    for (int32_t t : buf) {
      if (t < 0 || t >= src.vocab_size()) {
        throw DataError("token id " + std::to_string(t) + " in sample " + std::to_string(first_sample + b) + " is outside the vocabulary of " +
                        std::to_string(src.vocab_size()) + ": the data was made with another tokenizer (check --tokenizer-type / --vocab-size)");
      }
    }
    int32_t pos = 0, doc_start = 0;
    for (int64_t s = 0; s < S; ++s) {
      const auto i = static_cast<size_t>(b * S + s);
      mb.tokens[i] = buf[static_cast<size_t>(s)];
      mb.labels[i] = buf[static_cast<size_t>(s + 1)];
      mb.positions[i] = pos++;
      if (!mb.rope_positions.empty()) mb.rope_positions[i] = static_cast<int32_t>(s);
      if (cfg.data.eod_mask_loss && mb.tokens[i] == eod) mb.loss_mask[i] = 0.0f;
      if (cfg.data.reset_attention_mask) mb.row_start[i] = doc_start;
      if (cfg.data.reset_position_ids && mb.tokens[i] == eod) pos = 0;
      if (mb.tokens[i] == eod) doc_start = static_cast<int32_t>(s + 1);  // later tokens never see this document
    }
    if (pad < 0) continue;
    for (int64_t s = 0; s < S; ++s) {
      const auto i = static_cast<size_t>(b * S + s);
      if (mb.labels[i] == pad) {
        mb.loss_mask[i] = 0.0f;
        mb.labels[i] = 0;
      }
      if (mb.tokens[i] == pad) mb.tokens[i] = 0;
    }
  }
  return mb;
}

}  // namespace mt
