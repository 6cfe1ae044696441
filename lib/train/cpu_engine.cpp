// cpu_engine.cpp: Megatron's iteration on the reference engine: the configured schedule over this DP
// rank's microbatches, the bucketed gradient reductions, then the optimizer step unless the loss is not finite.
#include "train/cpu_engine.h"

#include <cmath>
#include <cstdio>
#include <numeric>

#include "model/context_parallel.h"
#include "model/cpu/units.h"
#include "pipeline/cpu_stage.h"
#include "pipeline/configured_schedule.h"
#include "train/moe_report.h"
#include "train/replica_check.h"
#include "train/train_common.h"

namespace mt {

namespace {

// Multi-token prediction under context parallelism: the modules' microbatches shifted over the whole sequences, to be sliced
// with them (Microbatch::mtp); without CP the model shifts its own.
Microbatch with_mtp_shifts(Microbatch mb, int64_t modules, int64_t cp) {
  for (int64_t k = 1; cp > 1 && k <= modules; ++k) mb.mtp.push_back(cpu::mtp_shifted(mb, k));
  return mb;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

CpuEngine::CpuEngine(const Config& cfg, ProcessGroups groups, const TokenSource& data, bool lead)
    : cfg_(cfg), groups_(std::move(groups)), data_(data), scaler_(cfg) {
  if (cfg.training.decoupled_lr) decoupled_.emplace(cfg, true);
  model_ = std::make_shared<GPTModel>(cfg, groups_);
  // --num-distributed-optimizer-instances (Megatron's partial distributed optimizer): the state sharded within contiguous
  // slices of DP x CP, each shard's gradients all-reduced across the slices; the optimizer's sums run over its slice.
  ProcessGroups optimizer_groups = groups_;
  std::shared_ptr<Communicator> instances;
  if (const int64_t n = cfg.training.num_distributed_optimizer_instances;
      n > 1 && cfg.training.use_distributed_optimizer && groups_.dp_cp->size() % n == 0) {  // (validated: DP x CP divisible by n)
    const int rank = groups_.dp_cp->rank(), per = groups_.dp_cp->size() / static_cast<int>(n);
    optimizer_groups.dp_cp = groups_.dp_cp->sub_group(rank / per, rank, "distributed-optimizer instance");
    instances = groups_.dp_cp->sub_group(rank % per, rank, "distributed-optimizer instances");
    instance_rank_ = rank / per;
  }
  data_parallel_ = std::make_unique<DataParallel>(cfg, model_->params(), optimizer_groups.dp_cp, GradGroup::kDense, 0, instances);
  FlatRanges owned = data_parallel_->owned_ranges();
  // The experts' gradients: summed over expert-DP and scaled by 1 / (DP x CP) as Megatron's (each expert saw the
  // tokens of several data-parallel replicas), sharded over expert-DP by the distributed optimizer.
  if (model_->params().has_experts()) {
    // (the partial distributed optimizer's instances over expert-DP as well: contiguous slices, Megatron's hierarchical groups)
    std::shared_ptr<Communicator> expert_instances;
    if (const int64_t n = cfg.training.num_distributed_optimizer_instances;
        n > 1 && cfg.training.use_distributed_optimizer && groups_.expert_dp->size() % n == 0) {
      const int rank = groups_.expert_dp->rank(), per = groups_.expert_dp->size() / static_cast<int>(n);
      optimizer_groups.expert_dp = groups_.expert_dp->sub_group(rank / per, rank, "expert distributed-optimizer instance");
      expert_instances = groups_.expert_dp->sub_group(rank % per, rank, "expert distributed-optimizer instances");
      expert_instance_rank_ = rank / per;
    }
    expert_parallel_ = std::make_unique<DataParallel>(cfg, model_->params(), optimizer_groups.expert_dp, GradGroup::kExpert,
                                                      1.0 / static_cast<double>(groups_.dp_cp->size()), expert_instances);
    for (const auto& r : expert_parallel_->owned_ranges()) owned.push_back(r);
  }
  optimizer_ = std::make_unique<Optimizer>(cfg, model_->params(), optimizer_groups, owned, data_parallel_->distributed_optimizer());
  model_->set_grads_ready_hook([this](size_t lowest) {
    data_parallel_->on_grads_ready(lowest);
    if (expert_parallel_) expert_parallel_->on_grads_ready(lowest);
  });
  // The tied word embeddings' bucket waits for their sum over the embedding group (sum_tied_embedding_grads).
  if (const size_t tied = tied_embedding_param(); tied != kNoParam) data_parallel_->hold(tied);
  // Resume: parameters, optimizer state, loss scaler, iteration and data position.
  const auto& ck = cfg.checkpoint;
  bool loaded = false;
  if (checkpoint_to_load(cfg)) {
    resumed_ = load_checkpoint(*ck.load, load_options(cfg), model_->params(), *optimizer_, scaler_);
    // (an upcycled model starts FP8's delayed scaling afresh: its experts have none saved)
    if (Fp8ScalingState* fp8 = model_->fp8_scaling(); fp8 && !cfg.moe.moe_use_upcycling) restore_fp8_scaling(cfg, *fp8, lead);
    loaded = true;
  }
  announce_load(cfg, resumed_, loaded, lead);
  if (ck.save) saver_ = make_saver(cfg, groups_);
}

// The model outlives the engine (TrainResult::model): it must not call into the engine's data parallelism.
CpuEngine::~CpuEngine() { model_->set_grads_ready_hook({}); }

std::vector<std::string> CpuEngine::describe() const {
  const double p = static_cast<double>(model_->params().numel());
  return {"model: " + std::to_string(model_->params().numel()) + " parameters on this rank; memory: weights " + mib(p * 4) + ", gradients " +
          mib(p * 4) + ", optimizer state " + mib(static_cast<double>(optimizer_->state_bytes())) + " (fp32 reference engine on CPU)"};
}

void CpuEngine::step(int64_t iteration, int64_t first_sample, int64_t num_microbatches, double lr) {
  const int64_t mbs = *cfg_.training.micro_batch_size, S = *cfg_.data.seq_length;
  const int64_t dp = groups_.dp->size(), dp_rank = groups_.dp->rank();
  const int64_t pp = groups_.pp->size();
  for_each_data_parallel([](DataParallel& d) { d.finish_param_gather(); });  // parameters updated by the other shards last step
  check_replicas();  // (--test-mode: Megatron runs it in each attention forward; once a step compares the same weights)
  model_->params().zero_grads();
  const float loss_scale = scaler_.scale();
  // --calculate-per-token-loss (Megatron's): each microbatch's loss is its sum, and the gradients are divided by the
  // global batch's loss tokens after the data-parallel reduction. Either way the loss reported is Megatron's: the
  // global batch's token losses summed over its loss tokens (each microbatch's mean weighted by its tokens).
  const bool per_token = cfg_.training.calculate_per_token_loss;
  std::vector<double> mb_tokens(static_cast<size_t>(num_microbatches));  // each microbatch's loss tokens (whole sequences)
  CpuPipelineStage stage(
      *model_,
      [&](int64_t m) {
        const Microbatch mb = make_microbatch(data_, Split::kTrain, first_sample + m * mbs * dp + dp_rank * mbs, mbs, S, cfg_);
        mb_tokens[static_cast<size_t>(m)] = loss_tokens(mb);
        return context_parallel_slice(with_mtp_shifts(mb, cfg_.model.mtp_num_layers.value_or(0), groups_.cp->size()), groups_.cp->rank(),
                                      groups_.cp->size());
      },
      iteration, per_token ? loss_scale : loss_scale / static_cast<float>(num_microbatches), groups_.pp.get(), mbs);
  run_schedule(training_schedule(cfg_, groups_.pp->rank(), pp, num_microbatches), stage, [&] { for_each_data_parallel([](DataParallel& d) { d.arm(); }); });
  sum_tied_embedding_grads();
  for_each_data_parallel([](DataParallel& d) { d.finish(); });
  if (cfg_.moe.moe_router_enable_expert_bias) model_->update_expert_biases(cfg_.moe.moe_router_bias_update_rate);
  if (cfg_.moe.load_balancing_is("quantile_balancing")) model_->update_quantile_biases(cfg_.moe.moe_router_quantile_balancing_ema);
  // Every stage forwards every microbatch, so every stage counted the tokens.
  double tokens = std::accumulate(mb_tokens.begin(), mb_tokens.end(), 0.0);
  groups_.dp->all_reduce(&tokens, 1, ReduceOp::kSum);
  tokens = std::max(tokens, 1.0);
  // The loss is the last stage's: every stage takes it (the others hold 0), so all decide alike. Each CP rank holds
  // its sequences' whole loss, so the sum runs over DP only.
  double loss = 0;
  for (const auto& [m, l] : stage.losses()) loss += per_token ? l : l * mb_tokens[static_cast<size_t>(m)];
  if (pp > 1) groups_.pp->all_reduce(&loss, 1, ReduceOp::kSum);
  groups_.dp->all_reduce(&loss, 1, ReduceOp::kSum);
  loss /= tokens;
  StepResult result{};
  const bool loss_finite = std::isfinite(loss);
  // (from the schedule's start: an upcycled model's restarts)
  const double decoupled = decoupled_ ? decoupled_->lr_at_samples(first_sample - resumed_.lr_schedule_start_samples) : -1.0;
  // (per token: the reduction averaged over DP; the gradients become the sum over the tokens / their count)
  const float unscale = per_token ? static_cast<float>(loss_scale * tokens / static_cast<double>(dp)) : loss_scale;
  if (loss_finite) result = optimizer_->step(lr, unscale, decoupled);
  if (loss_finite && !result.skipped) for_each_data_parallel([](DataParallel& d) { d.start_param_gather(); });
  const bool nonfinite = !loss_finite || result.skipped;
  scaler_.update(nonfinite);
  StepReport report{loss, result.grad_norm, nonfinite};
  report.num_zeros = nonfinite ? -1 : result.num_zeros;
  fill_moe_report(cfg_, groups_, model_->take_moe_stats(), num_microbatches, report);
  // Multi-token prediction's losses (Megatron's "mtp_k loss"): each module's mean over the microbatches, the last stage's,
  // averaged over DP.
  if (const int64_t n = cfg_.model.mtp_num_layers.value_or(0); n > 0) {
    std::vector<double> mtp = model_->take_mtp_losses();
    mtp.resize(static_cast<size_t>(n), 0.0);
    if (pp > 1) groups_.pp->all_reduce(mtp.data(), n, ReduceOp::kSum);
    groups_.dp->all_reduce(mtp.data(), n, ReduceOp::kAvg);
    for (int64_t k = 0; k < n; ++k) report.moe_losses.emplace_back("mtp_" + std::to_string(k + 1) + " loss", mtp[static_cast<size_t>(k)]);
  }
  reports_.push_back(std::move(report));
}

// Tied embeddings across pipeline stages (Megatron's _allreduce_word_embedding_grads): the first stage's word
// embeddings and the last stage's copy get the sum of both gradients, before the data-parallel reduction (so it
// is exact under the distributed optimizer's reduce-scatter too), and stay equal.
void CpuEngine::sum_tied_embedding_grads() {
  const size_t i = tied_embedding_param();
  if (i == kNoParam) return;
  groups_.embedding->all_reduce(model_->params().grad(i), model_->params().info(i).numel, ReduceOp::kSum);
}

size_t CpuEngine::tied_embedding_param() const {
  // (multi-token prediction's modules read the word embeddings on the last stage too: its copy of them)
  if (groups_.pp->size() == 1 || (!model_->dims().tied && model_->dims().mtp == 0)) return kNoParam;
  const ModelLayout& first = model_->layout(0);
  const ModelLayout& last = model_->layout(model_->chunks() - 1);
  if (first.pre_process) return first.word_embeddings;
  if (last.post_process) return model_->dims().mtp > 0 ? last.mtp_embedding : last.output_w;
  return kNoParam;  // a middle stage: not in the embedding group
}

std::vector<StepReport> CpuEngine::read_reports() { return std::exchange(reports_, {}); }

bool CpuEngine::any_rank(bool mine) {
  float v = mine ? 1.0f : 0.0f;
  if (groups_.world->size() > 1) groups_.world->all_reduce(&v, 1, ReduceOp::kMax);
  return v > 0;
}

double CpuEngine::loss_tokens(const Microbatch& mb) {
  double n = 0;
  for (float m : mb.loss_mask) n += m;
  return n;
}

void CpuEngine::check_replicas() {
  if (!cfg_.training.test_mode) return;
  const std::vector<size_t> norms = realtime_test_params(model_->params());
  check_replicas_equal(model_->params(), norms, *groups_.dp, "data-parallel");
  check_replicas_equal(model_->params(), norms, *groups_.tp, "tensor-parallel");
}

double CpuEngine::evaluate(int64_t iteration, Split split, int64_t first_sample) {
  for_each_data_parallel([](DataParallel& d) { d.finish_param_gather(); });
  check_replicas();  // (--test-mode: Megatron's test runs in every attention forward, evaluation's included)
  const int64_t mbs = cfg_.derived.eval_micro_batch_size, S = *cfg_.data.seq_length;
  const int64_t dp = groups_.dp->size(), r = groups_.dp->rank(), pp = groups_.pp->size();
  const int64_t per_iter = cfg_.derived.eval_global_batch_size, nmb = cfg_.derived.eval_num_microbatches;
  // Megatron's: the token losses summed over the loss tokens (each microbatch's mean weighted by its tokens; with
  // --calculate-per-token-loss each microbatch's loss is its sum already).
  const bool per_token = cfg_.training.calculate_per_token_loss;
  double sum = 0, n = 0;
  for (int64_t it = 0; it < cfg_.logging.eval_iters; ++it) {
    std::vector<double> mb_tokens(static_cast<size_t>(nmb));
    auto get = [&](int64_t m) {
      const Microbatch mb = make_microbatch(data_, split, first_sample + it * per_iter + m * mbs * dp + r * mbs, mbs, S, cfg_);
      mb_tokens[static_cast<size_t>(m)] = loss_tokens(mb);
      return context_parallel_slice(mb, groups_.cp->rank(), groups_.cp->size());
    };
    auto add = [&](int64_t m, double l) { sum += per_token ? l : l * mb_tokens[static_cast<size_t>(m)]; };
    if (pp == 1) {
      for (int64_t m = 0; m < nmb; ++m) add(m, model_->forward(get(m), iteration, false));
    } else {  // the forwards through the stages; the loss is the last stage's
      CpuPipelineStage stage(*model_, get, iteration, 0.0f, groups_.pp.get(), mbs, false);
      run_schedule(evaluation_schedule(cfg_, groups_.pp->rank(), pp, nmb), stage);
      for (const auto& [m, l] : stage.losses()) add(m, l);
    }
    n += std::accumulate(mb_tokens.begin(), mb_tokens.end(), 0.0);  // (every stage forwarded every microbatch)
  }
  if (pp > 1) groups_.pp->all_reduce(&sum, 1, ReduceOp::kSum);
  double buf[2] = {sum, n};
  groups_.dp->all_reduce(buf, 2, ReduceOp::kSum);
  return buf[0] / std::max(1.0, buf[1]);
}

void CpuEngine::save(TrainState state) {
  for_each_data_parallel([](DataParallel& d) { d.finish_param_gather(); });
  state.scaler = scaler_.state();
  CheckpointRank who;
  who.world_rank = groups_.world->rank();
  who.world_size = groups_.world->size();
  who.writes_params = groups_.dp_cp->rank() == 0;
  who.writes_optimizer = data_parallel_->distributed_optimizer() ? instance_rank_ == 0 : groups_.dp_cp->rank() == 0;  // (instance 0's shards)
  who.writes_expert_params = groups_.expert_dp->rank() == 0;
  who.writes_expert_optimizer = data_parallel_->distributed_optimizer() ? expert_instance_rank_ == 0 : groups_.expert_dp->rank() == 0;
  auto snap = take_snapshot(cfg_, model_->params(), *optimizer_, state, who, !cfg_.checkpoint.no_save_optim);
  if (const Fp8ScalingState* fp8 = model_->fp8_scaling(); fp8 && groups_.tp->rank() == 0 && groups_.dp_cp->rank() == 0) add_fp8_scaling_to(*snap, *fp8);
  saver_->save(std::move(snap));
}

void CpuEngine::finish() {
  if (saver_) saver_->wait();
  for_each_data_parallel([](DataParallel& d) { d.finish_param_gather(); });
}

}  // namespace mt
