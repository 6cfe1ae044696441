// trainer.h: the training loop: microbatches through the schedule, gradient reduction, optimizer
// step, learning-rate schedule, logging (one Megatron line per --log-interval, on rank 0), metrics
// file, non-finite loss handling and periodic validation.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"

namespace mt {

class GPTModel;

// MoE: the auxiliary losses of each iteration as logged, their names once and the values in rows (a name per value
// and iteration would grow a long run's result by about 100 bytes an iteration).
struct MoeLossHistory {
  std::vector<std::string> names;
  std::vector<double> values;  // [iteration][names.size()]
  size_t size() const { return names.empty() ? 0 : values.size() / names.size(); }
  bool empty() const { return size() == 0; }
  double at(size_t iteration, size_t j) const { return values.at(iteration * names.size() + j); }
  void push_back(const std::vector<std::pair<std::string, double>>& losses) {
    if (losses.empty()) return;
    if (names.empty()) {
      for (const auto& [name, value] : losses) names.push_back(name);
    } else if (losses.size() != names.size()) {
      throw std::logic_error("training: the MoE losses' names changed during the run");
    }
    for (size_t j = 0; j < losses.size(); ++j) {
      if (losses[j].first != names[j]) throw std::logic_error("training: the MoE losses' names changed during the run");
      values.push_back(losses[j].second);
    }
  }
};

struct TrainResult {
  std::shared_ptr<GPTModel> model;  // the trained shard
  std::vector<double> losses;       // per iteration (summed over the loss tokens, as Megatron reports it), skipped ones included
  std::vector<double> valid_losses; // per validation run (the one after the last iteration included)
  std::vector<double> test_losses;  // the test split's evaluation after the last iteration (none without a test split)
  std::vector<double> grad_norms;   // per iteration, before clipping
  std::vector<double> num_zeros;    // --log-num-zeros-in-grad: per iteration (-1 where skipped)
  // MoE, per iteration: the auxiliary losses as logged and the share of dropped choices.
  MoeLossHistory moe_losses;
  // --moe-per-layer-logging: the last iteration's losses per layer (only the last: a value per layer and iteration would
  // grow by kilobytes an iteration over a long run).
  std::vector<std::pair<std::string, std::vector<double>>> moe_layer_losses;
  std::vector<double> dropped_fraction;
  std::vector<double> routing_digest;  // the same choices and drops give the same digest whatever the layout
  int64_t iterations = 0;
  int64_t skipped = 0, nan_iterations = 0;
  double loss_scale = 1.0;  // fp16: the loss scale after the last iteration
};

struct TrainOptions {
  bool quiet = false;  // no log lines (tests)
  int64_t rank = 0;
};

TrainResult train(const Config& cfg, ProcessGroups groups, const TrainOptions& opt = {});

}  // namespace mt
