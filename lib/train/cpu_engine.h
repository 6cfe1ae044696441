// cpu_engine.h: the CPU reference engine behind the training loop: the model stage, data parallelism
// (bucketed, overlapped reductions, the distributed optimizer), AdamW on fp32 master weights, the host loss
// scaler and checkpoints; one pipeline stage of the model under PP (1F1B). Every step's result is known when
// step() returns.
#pragma once

#include <memory>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "data/token_source.h"
#include "model/gpt_model.h"
#include "optim/data_parallel.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "train/training_loop.h"

namespace mt {

class CpuEngine final : public TrainingEngine {
 public:
  CpuEngine(const Config& cfg, ProcessGroups groups, const TokenSource& data, bool lead);
  ~CpuEngine() override;
  TrainState resumed() const override { return resumed_; }
  std::vector<std::string> describe() const override;
  void step(int64_t iteration, int64_t first_sample, int64_t num_microbatches, double lr) override;
  bool reports_each_step() const override { return true; }
  std::vector<StepReport> read_reports() override;
  double loss_scale() const override { return scaler_.scale(); }
  double params_norm() override { return optimizer_->params_norm(); }
  bool any_rank(bool mine) override;
  double evaluate(int64_t iteration, Split split, int64_t first_sample) override;
  void save(TrainState state) override;
  void finish() override;
  std::shared_ptr<GPTModel> cpu_model() const override { return model_; }

 private:
  void sum_tied_embedding_grads();
  static double loss_tokens(const Microbatch& mb);  // the loss mask's sum (whole sequences, before the CP slice)
  size_t tied_embedding_param() const;  // this rank's tied word embeddings across stages, or kNoParam
  const Config& cfg_;
  ProcessGroups groups_;
  const TokenSource& data_;
  std::shared_ptr<GPTModel> model_;
  std::unique_ptr<DataParallel> data_parallel_;
  int64_t instance_rank_ = 0, expert_instance_rank_ = 0;  // --num-distributed-optimizer-instances: this rank's instance (the first writes)
  void check_replicas();  // --test-mode (train/replica_check.h)
  std::unique_ptr<DataParallel> expert_parallel_;  // the expert parameters' reductions over expert-DP (MoE)
  template <typename F>
  void for_each_data_parallel(F f) {
    f(*data_parallel_);
    if (expert_parallel_) f(*expert_parallel_);
  }
  std::unique_ptr<Optimizer> optimizer_;
  LossScaler scaler_;
  std::optional<LrSchedule> decoupled_;  // --decoupled-lr: the word embeddings' and output layer's schedule
  std::unique_ptr<CheckpointSaver> saver_;
  TrainState resumed_;
  std::vector<StepReport> reports_;
};

}  // namespace mt
