// train_common.cpp
#include "train/train_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.h"
#include "config/errors.h"
#include "model/layout.h"

namespace mt {

std::unique_ptr<TokenSource> open_training_data(const Config& cfg) {
  auto src = make_token_source(cfg);
  if (cfg.derived.vocab_size != src->vocab_size()) {
    throw ConfigError("the data has a vocabulary of " + std::to_string(src->vocab_size()) + " but the model was configured for " +
                      std::to_string(cfg.derived.vocab_size) + ": fix --vocab-size or --tokenizer-type");
  }
  return src;
}

MetricsFile::MetricsFile(const Config& cfg, int64_t rank, int64_t world_size) : log_(cfg.logging), world_size_(world_size) {
  if (rank != 0) return;
  if (cfg.logging.tensorboard_dir) tb_ = std::make_unique<TensorBoardWriter>(*cfg.logging.tensorboard_dir);
  const std::string log_dir = cfg.logging.log_dir.value_or(cfg.checkpoint.save.value_or(""));
  if (log_dir.empty()) return;
  std::filesystem::create_directories(log_dir);
  out_ = std::make_unique<std::ofstream>(std::filesystem::path(log_dir) / "metrics.jsonl", std::ios::app);
  if (!*out_) throw ConfigError("cannot write " + log_dir + "/metrics.jsonl: check --log-dir");
}

// A line that cannot be written (a full disk) is reported once; training goes on, and the stream is cleared
// so that later lines are tried again.
void MetricsFile::write_line(const std::string& line) {
  *out_ << line << "\n" << std::flush;
  if (*out_) return;
  out_->clear();
  if (!write_failed_) std::cerr << "megatrain: warning: a metrics.jsonl line could not be written (disk full?); training continues, lines may be missing\n";
  write_failed_ = true;
}

template <typename F>
void MetricsFile::tensorboard(F&& write) {
  if (!tb_) return;
  try {
    write(*tb_);
    tb_->flush();
  } catch (const std::exception& e) {
    std::cerr << "megatrain: warning: " << e.what() << "; no more TensorBoard output in this run\n";
    tb_.reset();
  }
}

void MetricsFile::iteration(const IterationStats& s) {
  // Megatron's timers at --timing-log-level 0 (the only one here), at every log line whatever --tensorboard-log-interval:
  // with --log-timers-to-tensorboard the iteration time (not at the run's first iteration) and with --log-throughput the
  // throughput.
  if (log_.log_timers_to_tensorboard) tensorboard([&](TensorBoardWriter& tb) {
    if (!s.first_iteration) tb.scalar("iteration-time", s.ms_per_iter / 1000.0, s.iteration);
    if (log_.log_throughput) tb.scalar("throughput", s.tflops_per_gpu, s.iteration);
  });
  if (s.iteration % log_.tensorboard_log_interval == 0) tensorboard([&](TensorBoardWriter& tb) {  // Megatron's tags (its training_log)
    const int64_t it = s.iteration, n = s.consumed_samples;
    auto both = [&](const std::string& tag, double v) {
      tb.scalar(tag, v, it);
      tb.scalar(tag + " vs samples", v, n);
    };
    if (!log_.no_log_learning_rate_to_tensorboard) both("learning-rate", s.lr);
    if (log_.log_batch_size_to_tensorboard) both("batch-size", static_cast<double>(s.global_batch));
    if (log_.log_world_size_to_tensorboard) both("world-size", static_cast<double>(world_size_));
    both("lm loss", s.loss);
    if (!log_.no_log_loss_scale_to_tensorboard) both("loss-scale", s.loss_scale);
    both("grad-norm", s.grad_norm);
    if (s.num_zeros >= 0) both("num-zeros", s.num_zeros);
    if (s.params_norm >= 0) both("params-norm", s.params_norm);
    tb.scalar("tokens-per-second-per-gpu", s.tokens_per_s_per_gpu, it);
    if (s.mfu >= 0) tb.scalar("mfu", s.mfu, it);
    if (log_.log_memory_to_tensorboard && s.memory.reserved >= 0) {  // Megatron's tags (torch.cuda.memory_stats there)
      tb.scalar("mem-reserved-bytes", s.memory.reserved, it);
      tb.scalar("mem-allocated-bytes", s.memory.allocated, it);
      tb.scalar("mem-max-allocated-bytes", s.memory.max_allocated, it);
      tb.scalar("mem-allocated-count", s.memory.allocations, it);
    }
    for (const auto& [name, value] : s.moe_losses) both(name, value);  // Megatron's track_moe_metrics tags
    for (const auto& [name, per_layer] : s.moe_layer_losses) {  // --moe-per-layer-logging (its tags: every layer, by index)
      for (size_t l = 0; l < per_layer.size(); ++l) tb.scalar("moe/" + name + "_layer_" + std::to_string(l), per_layer[l], it);
    }
  });
  if (!out_) return;
  nlohmann::json j = {{"iteration", s.iteration}, {"consumed_samples", s.consumed_samples}, {"global_batch_size", s.global_batch}, {"lm_loss", s.loss},
                      {"learning_rate", s.lr}, {"grad_norm", s.grad_norm}, {"loss_scale", s.loss_scale},
                      {"ms_per_iteration", s.ms_per_iter}, {"tokens_per_s_per_gpu", s.tokens_per_s_per_gpu},
                      {"tflops_per_gpu", s.tflops_per_gpu}, {"skipped_iterations", s.skipped},
                      {"nan_iterations", s.nan_iters}};
  if (s.mfu >= 0) j["mfu"] = s.mfu;
  if (s.num_zeros >= 0) j["num_zeros"] = s.num_zeros;
  if (s.memory.reserved >= 0) {
    j["gpu_memory_in_use_bytes"] = s.memory.in_use_most;
    j["gpu_memory_max_allocated_bytes"] = s.memory.max_allocated_most;
    j["gpu_memory_device_peak_bytes"] = s.memory.peak_used;
  }
  for (const auto& [name, value] : s.moe_losses) j[name] = value;
  if (s.expert_tokens_min >= 0) {
    j["expert_tokens_min"] = s.expert_tokens_min;
    j["expert_tokens_mean"] = s.expert_tokens_mean;
    j["expert_tokens_max"] = s.expert_tokens_max;
    j["dropped_fraction"] = s.dropped_fraction;
  }
  write_line(j.dump());
}

MetricsFile::~MetricsFile() = default;

void MetricsFile::validation(int64_t iteration, double loss, int64_t samples, bool after_training) {
  if (out_) {
    nlohmann::json j{{"iteration", iteration}, {"validation_lm_loss", loss}};
    if (after_training) j["after_training"] = true;
    write_line(j.dump());
  }
  validation_scalars(iteration, loss, samples);
}

void MetricsFile::test(int64_t iteration, double loss, int64_t samples) {
  if (out_) write_line(nlohmann::json{{"iteration", iteration}, {"test_lm_loss", loss}}.dump());
  validation_scalars(iteration, loss, samples);
}

void MetricsFile::validation_scalars(int64_t iteration, double loss, int64_t samples) {
  tensorboard([&](TensorBoardWriter& tb) {
    tb.scalar("lm loss validation", loss, iteration);
    tb.scalar("lm loss validation vs samples", loss, samples);
    if (log_.log_validation_ppl_to_tensorboard) {
      tb.scalar("lm loss validation ppl", std::exp(std::min(20.0, loss)), iteration);
      tb.scalar("lm loss validation ppl vs samples", std::exp(std::min(20.0, loss)), samples);
    }
  });
}

LoadOptions load_options(const Config& cfg) {
  const auto& ck = cfg.checkpoint;
  LoadOptions lo;
  lo.step = ck.ckpt_step;
  lo.finetune = ck.finetune;
  lo.load_optimizer = !ck.no_load_optim && !ck.finetune;
  lo.optimizer_kind = cfg.training.optimizer;
  lo.vocab_size = cfg.derived.vocab_size;
  // A pipeline stage (and an EP rank: its experts) holds some of the model's tensors; the checkpoint must hold all of them.
  if (cfg.parallel.pipeline_model_parallel_size > 1 || cfg.parallel.expert_model_parallel_size > 1) lo.model_tensors = model_tensor_count(cfg);
  lo.run_config = &cfg;
  lo.upcycle = cfg.moe.moe_use_upcycling;
  if (lo.upcycle) lo.load_optimizer = false;  // (Megatron forces --no-load-optim and --no-load-rng)
  return lo;
}

bool checkpoint_to_load(const Config& cfg) {
  const auto& ck = cfg.checkpoint;
  const bool found = ck.load && (ck.ckpt_step || latest_checkpoint(*ck.load));
  if (!found && cfg.moe.moe_use_upcycling) {
    throw DataError("--moe-use-upcycling: no checkpoint in --load " + ck.load.value_or("") + " (no latest_checkpointed_iteration.txt): give the dense "
                    "model's checkpoint directory");
  }
  return found;
}

std::unique_ptr<CheckpointSaver> make_saver(const Config& cfg, const ProcessGroups& groups) {
  const auto& ck = cfg.checkpoint;
  if (ck.async_save && groups.world->size() > 1 && mpi_active() && !mpi_thread_multiple()) {
    throw ConfigError("--async-save needs MPI_THREAD_MULTIPLE, which this MPI library did not grant: drop --async-save");
  }
  return std::make_unique<CheckpointSaver>(*ck.save, ck.async_save, CheckpointRetention{ck.ckpt_keep_last, ck.save_retain_interval.value_or(0)},
                                           groups.checkpoint);
}

void add_fp8_scaling_to(Snapshot& snap, const Fp8ScalingState& state) {
  std::map<int64_t, std::vector<float>> layers;
  for (size_t i = 0; i < state.layers.size(); ++i) layers[state.layers[i]] = state.layer_state(static_cast<int64_t>(i));
  add_fp8_scaling(snap, layers, state.recipe.history_len);
}

void restore_fp8_scaling(const Config& cfg, Fp8ScalingState& state, bool lead) {
  const auto& ck = cfg.checkpoint;
  int64_t saved_len = 0;
  const auto saved = load_fp8_scaling(*ck.load, ck.ckpt_step, state.layers, &saved_len);
  size_t restored = 0;
  for (const auto& [layer, data] : saved) {
    const int64_t index = state.index_of(layer);  // (load_fp8_scaling reads this state's layers only)
    if (!state.set_layer_state(index, data, saved_len)) {
      const int64_t experts = state.experts[static_cast<size_t>(index)];
      throw DataError(*ck.load + ": the FP8 scaling state of layer " + std::to_string(layer) + " has " + std::to_string(data.size()) +
                      " values, not " + std::to_string(fp8_layer_state_size(saved_len, experts)) +
                      (experts > 0 ? " (its " + std::to_string(experts) + " experts' too)" : std::string()) +
                      ": the checkpoint is damaged, or was saved with another number of experts");
    }
    ++restored;
  }
  if (!lead) return;
  if (restored < state.layers.size() && !state.layers.empty()) {
    std::printf("note: the checkpoint holds no FP8 delayed-scaling state for %zu of this stage's %zu FP8 layers (saved without "
                "--fp8-recipe delayed): their scales start at 1\n", state.layers.size() - restored, state.layers.size());
  } else if (saved_len != state.recipe.history_len && restored > 0) {
    std::printf("note: the checkpoint's FP8 amax histories hold %lld entries, --fp8-amax-history-len is %lld: the scales are kept, the "
                "histories start afresh\n", static_cast<long long>(saved_len), static_cast<long long>(state.recipe.history_len));
  }
}

}  // namespace mt
