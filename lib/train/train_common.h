// train_common.h: what the CPU and CUDA training loops share: the training data (its vocabulary checked
// against the model's), the metrics file and its JSON lines, and the checkpoint options from the flags.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/token_source.h"
#include "model/fp8_scaling.h"
#include "train/log_line.h"
#include "train/tensorboard.h"

namespace mt {

// Throws ConfigError when the data's vocabulary differs from the configured one.
std::unique_ptr<TokenSource> open_training_data(const Config& cfg);

// DIR/metrics.jsonl (DIR = --log-dir, else --save), appended to by rank 0; other ranks and runs without a
// directory write nothing.
// With --tensorboard-dir, rank 0 also writes Megatron's TensorBoard scalars there (one point per log
// interval, and the "vs samples" forms).
class MetricsFile {
 public:
  MetricsFile(const Config& cfg, int64_t rank, int64_t world_size = 1);
  ~MetricsFile();
  void iteration(const IterationStats& s);
  // consumed_samples: by the training so far (TensorBoard's "vs samples" step).
  // after_training: the evaluation after the last iteration (metrics.jsonl marks it, beside the one of that iteration).
  void validation(int64_t iteration, double loss, int64_t consumed_samples, bool after_training = false);
  // The test split's evaluation after the last iteration: TensorBoard's validation tags, as Megatron writes it (its test
  // evaluation reports through the same function); metrics.jsonl's test_lm_loss.
  void test(int64_t iteration, double loss, int64_t consumed_samples);

 private:
  std::unique_ptr<std::ofstream> out_;
  bool write_failed_ = false;  // warned once
  void write_line(const std::string& line);
  void validation_scalars(int64_t iteration, double loss, int64_t consumed_samples);
  std::unique_ptr<TensorBoardWriter> tb_;
  const LoggingConfig log_;
  int64_t world_size_ = 1;
  // TensorBoard write errors (disk full) end TensorBoard output with a warning, not the training.
  template <typename F>
  void tensorboard(F&& write);
};

LoadOptions load_options(const Config& cfg);
// Whether the run loads a checkpoint (--load holding one, or --ckpt-step); with --moe-use-upcycling one must be there.
bool checkpoint_to_load(const Config& cfg);
// The --save saver (needs MPI_THREAD_MULTIPLE for --async-save across ranks: refused otherwise).
std::unique_ptr<CheckpointSaver> make_saver(const Config& cfg, const ProcessGroups& groups);

// FP8's delayed scaling in checkpoints: the rank that writes a stage's state (TP, DP and CP rank 0: every rank of
// the amax group holds the same) adds it to its snapshot; a load restores each FP8 layer's scales and histories
// (a checkpoint without them, say from a bf16 run: scales start at 1, with a note from `lead`).
void add_fp8_scaling_to(Snapshot& snap, const Fp8ScalingState& state);
void restore_fp8_scaling(const Config& cfg, Fp8ScalingState& state, bool lead);

}  // namespace mt
