// log_line.cpp: Megatron's training_log() shape.
#include "train/log_line.h"

#include <cmath>
#include <cstdio>
#include <ctime>

namespace mt {

std::string timestamp_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string format_iteration_line(const IterationStats& s) {
  char buf[1024];
  int n = std::snprintf(buf, sizeof(buf),
                        " [%s] iteration %8lld/%8lld | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
                        "throughput per GPU (TFLOP/s/GPU): %.1f | learning rate: %.6E | ",
                        timestamp_now().c_str(), static_cast<long long>(s.iteration), static_cast<long long>(s.train_iters),
                        static_cast<long long>(s.consumed_samples), s.ms_per_iter, s.tflops_per_gpu, s.lr);
  std::string out(buf, static_cast<size_t>(n));
  if (s.decoupled_lr >= 0) {
    std::snprintf(buf, sizeof(buf), "decoupled learning rate: %.6E | ", s.decoupled_lr);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "global batch size: %5lld | lm loss: %.6E | ", static_cast<long long>(s.global_batch), s.loss);
  out += buf;
  for (const auto& [name, value] : s.moe_losses) {
    std::snprintf(buf, sizeof(buf), "%s: %.6E | ", name.c_str(), value);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "loss scale: %.1f | grad norm: %.3f | ", s.loss_scale, s.grad_norm);
  out += buf;
  if (s.num_zeros >= 0) {  // (Megatron's: the count as a Python float)
    std::snprintf(buf, sizeof(buf), "num zeros: %.1f | ", s.num_zeros);
    out += buf;
  }
  if (s.params_norm >= 0) {
    std::snprintf(buf, sizeof(buf), "params norm: %.3f | ", s.params_norm);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "number of skipped iterations: %3lld | number of nan iterations: %3lld | tokens/s/GPU: %.0f | ",
                static_cast<long long>(s.skipped), static_cast<long long>(s.nan_iters), s.tokens_per_s_per_gpu);
  out += buf;
  if (s.expert_tokens_min >= 0) {
    std::snprintf(buf, sizeof(buf), "tokens per expert: min %.0f mean %.0f max %.0f | dropped: %.2f%% | ", s.expert_tokens_min, s.expert_tokens_mean,
                  s.expert_tokens_max, 100.0 * s.dropped_fraction);
    out += buf;
  }
  if (s.mfu >= 0) {
    std::snprintf(buf, sizeof(buf), "MFU: %.1f%% |", 100.0 * s.mfu);
    out += buf;
  } else {
    out += "MFU: n/a (no GPU peak) |";
  }
  if (s.memory.reserved >= 0) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::snprintf(buf, sizeof(buf), " GPU memory (GiB): %.2f in use (max %.2f), device peak %.2f |", s.memory.in_use_most / gib,
                  s.memory.max_allocated_most / gib, s.memory.peak_used / gib);
    out += buf;
  }
  // The time to the last iteration at this interval's pace.
  if (s.train_iters > s.iteration && s.ms_per_iter > 0) {
    const auto secs = static_cast<long long>(std::llround(static_cast<double>(s.train_iters - s.iteration) * s.ms_per_iter / 1000.0));
    std::snprintf(buf, sizeof(buf), " ETA: %lld:%02lld:%02lld |", secs / 3600, secs / 60 % 60, secs % 60);
    out += buf;
  }
  return out;
}

std::string format_validation_line(int64_t iteration, double loss, const std::string& where) {
  char buf[320];
  std::snprintf(buf, sizeof(buf), " validation loss at iteration %lld%s | lm loss value: %.6E | lm loss PPL: %.6E | ",
                static_cast<long long>(iteration), where.c_str(), loss, std::exp(std::min(loss, 20.0)));
  const std::string line(buf);
  const std::string bar(line.size() + 1, '-');
  return bar + "\n" + line + "\n" + bar;
}

}  // namespace mt
