// cpu_engine.cpp: Megatron's iteration on the reference engine: the schedule (no pipelining) over this DP
// rank's microbatches, the bucketed gradient reductions, then the optimizer step unless the loss is not finite.
#include "train/cpu_engine.h"

#include <cmath>
#include <cstdio>

#include "pipeline/cpu_stage.h"
#include "pipeline/schedule.h"
#include "train/train_common.h"

namespace mt {
namespace {

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

CpuEngine::CpuEngine(const Config& cfg, ProcessGroups groups, const TokenSource& data, bool lead)
    : cfg_(cfg), groups_(std::move(groups)), data_(data), scaler_(cfg) {
  model_ = std::make_shared<GPTModel>(cfg, groups_);
  data_parallel_ = std::make_unique<DataParallel>(cfg, model_->params(), groups_.dp_cp);
  optimizer_ = std::make_unique<Optimizer>(cfg, model_->params(), groups_, data_parallel_->owned_ranges(),
                                           data_parallel_->distributed_optimizer() && groups_.dp_cp->size() > 1);
  model_->set_grads_ready_hook([this](int64_t lowest) { data_parallel_->on_grads_ready(lowest); });
  // Resume: parameters, optimizer state, loss scaler, iteration and data position.
  const auto& ck = cfg.checkpoint;
  bool loaded = false;
  if (ck.load && (ck.ckpt_step || latest_checkpoint(*ck.load))) {
    resumed_ = load_checkpoint(*ck.load, load_options(cfg), model_->params(), *optimizer_, scaler_);
    loaded = true;
  }
  announce_load(cfg, resumed_, loaded, lead);
  if (ck.save) saver_ = make_saver(cfg, groups_);
}

CpuEngine::~CpuEngine() = default;

std::vector<std::string> CpuEngine::describe() const {
  const double p = static_cast<double>(model_->params().numel());
  return {"model: " + std::to_string(model_->params().numel()) + " parameters on this rank; memory: weights " + mib(p * 4) + ", gradients " +
          mib(p * 4) + ", optimizer state " + mib(static_cast<double>(optimizer_->state_bytes())) + " (fp32 reference engine on CPU)"};
}

void CpuEngine::step(int64_t iteration, int64_t first_sample, int64_t num_microbatches, double lr) {
  const int64_t mbs = *cfg_.training.micro_batch_size, S = *cfg_.data.seq_length;
  const int64_t dp = groups_.dp->size(), dp_rank = groups_.dp->rank();
  data_parallel_->finish_param_gather();  // parameters updated by the other shards last step
  model_->params().zero_grads();
  const float loss_scale = scaler_.scale();
  CpuPipelineStage stage(
      *model_,
      [&](int64_t m) { return make_microbatch(data_, Split::kTrain, first_sample + m * mbs * dp + dp_rank * mbs, mbs, S, cfg_); },
      iteration, loss_scale / static_cast<float>(num_microbatches));
  run_schedule(no_pipelining_schedule(num_microbatches), stage, [&] { data_parallel_->arm(); });
  data_parallel_->finish();
  double loss = stage.mean_loss();
  groups_.dp_cp->all_reduce(&loss, 1, ReduceOp::kAvg);
  StepResult result{};
  const bool loss_finite = std::isfinite(loss);
  if (loss_finite) result = optimizer_->step(lr, loss_scale);
  if (loss_finite && !result.skipped) data_parallel_->start_param_gather();
  const bool nonfinite = !loss_finite || result.skipped;
  scaler_.update(nonfinite);
  reports_.push_back({loss, result.grad_norm, nonfinite});
}

std::vector<StepReport> CpuEngine::read_reports() { return std::exchange(reports_, {}); }

double CpuEngine::evaluate(int64_t iteration) {
  data_parallel_->finish_param_gather();
  const int64_t mbs = *cfg_.training.micro_batch_size, S = *cfg_.data.seq_length;
  const int64_t dp = groups_.dp->size(), r = groups_.dp->rank();
  const int64_t per_iter = cfg_.derived.global_batch_size;
  double sum = 0;
  int64_t n = 0;
  for (int64_t it = 0; it < cfg_.logging.eval_iters; ++it) {
    for (int64_t m = 0; m < cfg_.derived.num_microbatches; ++m) {
      const int64_t first = it * per_iter + m * mbs * dp + r * mbs;
      sum += model_->forward(make_microbatch(data_, Split::kValid, first, mbs, S, cfg_), iteration, false);
      ++n;
    }
  }
  double buf[2] = {sum, static_cast<double>(n)};
  groups_.dp->all_reduce(buf, 2, ReduceOp::kSum);
  return buf[0] / std::max(1.0, buf[1]);
}

void CpuEngine::save(TrainState state) {
  data_parallel_->finish_param_gather();
  state.scaler = scaler_.state();
  CheckpointRank who;
  who.world_rank = groups_.world->rank();
  who.world_size = groups_.world->size();
  who.writes_params = groups_.dp_cp->rank() == 0;
  who.writes_optimizer = data_parallel_->distributed_optimizer() || groups_.dp_cp->rank() == 0;
  saver_->save(take_snapshot(cfg_, model_->params(), *optimizer_, state, who, !cfg_.checkpoint.no_save_optim));
}

void CpuEngine::finish() {
  if (saver_) saver_->wait();
  data_parallel_->finish_param_gather();
}

}  // namespace mt
