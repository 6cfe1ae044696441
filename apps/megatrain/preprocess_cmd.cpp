// preprocess_cmd.cpp: `megatrain preprocess`: a JSON-lines (or plain text) corpus -> Megatron's
// OUTPUT_{key}_document.bin/.idx, tokenized by several threads, with a progress line on a terminal.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <thread>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "config/errors.h"
#include "data/indexed_dataset.h"
#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"

namespace mt {
namespace {

struct Options {
  std::string input, output_prefix, tokenizer_type, vocab_file, merge_file, tokenizer_model;
  std::vector<std::string> json_keys{"text"};
  int64_t vocab_size = 0;
  bool append_eod = false;
  bool hf_no_special_tokens = false;
  int workers = 0;
};

// Reads documents in batches: JSON objects per line, or blank-line-separated paragraphs of text.
class DocumentReader {
 public:
  DocumentReader(const std::string& path, const std::vector<std::string>& keys) : in_(path, std::ios::binary), path_(path), keys_(keys) {
    if (!in_) throw ConfigError("cannot read --input '" + path + "': check the path");
    const std::string ext = std::filesystem::path(path).extension().string();
    text_ = !(ext == ".jsonl" || ext == ".json" || ext == ".ndjson");
    size_ = std::filesystem::file_size(path);
  }
  // Up to n documents; each holds one string per key. Empty at the end.
  std::vector<std::vector<std::string>> next(size_t n) {
    std::vector<std::vector<std::string>> docs;
    std::string line;
    while (docs.size() < n && std::getline(in_, line)) {
      ++line_no_;
      bytes_ += line.size() + 1;
      if (text_) {
        if (line.empty() || line == "\r") {
          if (!para_.empty()) docs.push_back({std::move(para_)});
          para_.clear();
        } else {
          para_ += line + "\n";
        }
        continue;
      }
      if (line.empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        throw DataError(path_ + " line " + std::to_string(line_no_) + ": not valid JSON (" + json_error_text(e) + ")");
      }
      std::vector<std::string> fields;
      for (const auto& k : keys_) {
        if (!j.is_object() || !j.contains(k) || !j[k].is_string()) {
          throw DataError(path_ + " line " + std::to_string(line_no_) + ": no string field '" + k + "' (see --json-keys)");
        }
        fields.push_back(j[k].get<std::string>());
      }
      docs.push_back(std::move(fields));
    }
    if (docs.size() < n && text_ && !para_.empty() && in_.eof()) {
      docs.push_back({std::move(para_)});
      para_.clear();
    }
    return docs;
  }
  uint64_t bytes_read() const { return bytes_; }
  uint64_t size() const { return size_; }
  bool text() const { return text_; }

 private:
  std::ifstream in_;
  std::string path_;
  std::vector<std::string> keys_;
  bool text_ = false;
  uint64_t size_ = 0, bytes_ = 0, line_no_ = 0;
  std::string para_;
};

}  // namespace

int run_preprocess(int argc, char** argv) {
  CLI::App app{"megatrain preprocess: tokenize a corpus into Megatron's indexed dataset (.bin/.idx)", "megatrain preprocess"};
  Options o;
  app.add_option("--input", o.input, "Input corpus: .jsonl (one JSON object per line) or text (blank-line-separated documents)")->required();
  app.add_option("--json-keys", o.json_keys, "JSON keys to tokenize, one output dataset per key (default: text)");
  app.add_option("--output-prefix", o.output_prefix, "Output prefix: writes PREFIX_{key}_document.bin/.idx")->required();
  app.add_option("--tokenizer-type", o.tokenizer_type, "GPT2BPETokenizer | HuggingFaceTokenizer | SentencePieceTokenizer | GPTSentencePieceTokenizer | Llama2Tokenizer | NullTokenizer | ByteTokenizer")->required();
  app.add_option("--tokenizer-model", o.tokenizer_model, "HuggingFaceTokenizer: a local tokenizer.json, or its directory; SentencePiece: the .model file");
  app.add_option("--vocab-file", o.vocab_file, "GPT-2 vocab.json");
  app.add_option("--merge-file", o.merge_file, "GPT-2 merges.txt");
  app.add_option("--vocab-size", o.vocab_size, "Vocabulary size (NullTokenizer)");
  app.add_flag("--append-eod", o.append_eod, "Append the end-of-document token to every document");
  app.add_flag("--tokenizer-hf-no-include-special-tokens", o.hf_no_special_tokens,
               "HuggingFaceTokenizer: leave out the post-processor's special tokens (BOS, ...), as HF's add_special_tokens=False");
  app.add_option("--workers", o.workers, "Tokenizer threads (default: all cores)");
  bool split_sentences = false;
  app.add_flag("--split-sentences", split_sentences, "Not supported: documents are stored whole");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (split_sentences) throw ConfigError("--split-sentences is not supported: megatrain stores each document as one sequence");
  const auto tok = make_tokenizer(o.tokenizer_type, o.vocab_file, o.merge_file, o.vocab_size, o.tokenizer_model);
  if (o.hf_no_special_tokens) {
    auto* hf = dynamic_cast<HfBpeTokenizer*>(tok.get());
    if (!hf) throw ConfigError("--tokenizer-hf-no-include-special-tokens applies to --tokenizer-type HuggingFaceTokenizer");
    hf->leave_out_special_tokens();
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.workers > cores) {
    std::cerr << "megatrain preprocess: note: --workers " << o.workers << " is more than this machine's " << cores << " cores: using " << cores << "\n";
  }
  const int workers = o.workers > 0 ? std::min(o.workers, cores) : cores;
  DocumentReader reader(o.input, o.json_keys);
  const std::vector<std::string> keys = reader.text() ? std::vector<std::string>{"text"} : o.json_keys;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  const uint8_t dtype = indexed_dtype_for_vocab(tok->vocab_size());
  for (const auto& k : keys) {
    const std::filesystem::path out = o.output_prefix + "_" + k + "_document";
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    writers.push_back(std::make_unique<IndexedDatasetWriter>(out.string(), dtype));
  }
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  uint64_t docs_done = 0, tokens = 0;
  auto progress = [&](bool final) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double mbps = static_cast<double>(reader.bytes_read()) / 1e6 / std::max(secs, 1e-9);
    const double left = static_cast<double>(reader.size() - std::min(reader.size(), reader.bytes_read())) / 1e6 / std::max(mbps, 1e-9);
    char buf[256];
    std::snprintf(buf, sizeof(buf), "documents %llu | %.1f MB of %.1f MB | %.2f MB/s | %llu tokens | %s %.0f s",
                  static_cast<unsigned long long>(docs_done), static_cast<double>(reader.bytes_read()) / 1e6,
                  static_cast<double>(reader.size()) / 1e6, mbps, static_cast<unsigned long long>(tokens), final ? "took" : "ETA",
                  final ? secs : left);
    if (tty && !final) std::cerr << "\r" << buf << "\033[K" << std::flush;
    else if (final) std::cerr << (tty ? "\r" : "") << "megatrain preprocess: " << buf << (tty ? "\033[K" : "") << "\n";
  };
  for (;;) {
    auto batch = reader.next(static_cast<size_t>(workers) * 256);
    if (batch.empty()) break;
    std::vector<std::vector<std::vector<int32_t>>> ids(batch.size(), std::vector<std::vector<int32_t>>(keys.size()));
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    std::exception_ptr error;
    std::mutex err_mu;
    for (int w = 0; w < workers; ++w) {
      pool.emplace_back([&] {
        try {
          for (size_t i; (i = next.fetch_add(1)) < batch.size();) {
            for (size_t k = 0; k < keys.size(); ++k) {
              ids[i][k] = tok->encode(batch[i][k]);
              if (o.append_eod) ids[i][k].push_back(tok->eod());
            }
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(err_mu);
          error = std::current_exception();
        }
      });
    }
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
    for (size_t i = 0; i < batch.size(); ++i) {
      for (size_t k = 0; k < keys.size(); ++k) {
        if (ids[i][k].empty()) continue;  // Megatron skips empty documents
        writers[k]->add_document(ids[i][k]);
        tokens += ids[i][k].size();
      }
    }
    docs_done += batch.size();
    if (std::chrono::steady_clock::now() - last > std::chrono::milliseconds(500)) {
      progress(false);
      last = std::chrono::steady_clock::now();
    }
  }
  for (auto& w : writers) w->finalize();
  progress(true);
  for (const auto& k : keys) std::cerr << "megatrain preprocess: wrote " << o.output_prefix << "_" << k << "_document.{bin,idx}\n";
  return 0;
}

}  // namespace mt
