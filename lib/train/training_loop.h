// training_loop.h: Megatron's train() loop, once for both engines: the batch schedule (and its ramp-up), the
// learning rate by consumed samples, the log line and metrics file (TensorBoard too), the non-finite counts
// and --exit-on-nan-count, evaluation, checkpoint saves and --exit-interval. The engine behind
// TrainingEngine runs the iteration (schedule, gradient reductions, optimizer step) and owns the model, the
// optimizer state and how they are saved.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "data/token_source.h"
#include "train/log_line.h"
#include "train/trainer.h"

namespace mt {

// One iteration as the engine reports it.
struct StepReport {
  double loss = 0;       // the token losses summed over the global batch's loss tokens (Megatron's report)
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // the update was skipped: a non-finite loss or gradient (fp16: or an overflow)
  double num_zeros = -1;  // --log-num-zeros-in-grad: the gradient's zero entries (-1: not counted, or a skipped step)
  // MoE: the auxiliary losses as Megatron logs them (load_balancing_loss or its seq / global form, z_loss: without
  // their coefficients, averaged over microbatches and MoE layers), and the tokens each expert received this
  // iteration over every layer and rank (min / mean / max over layers x experts) with the share of dropped choices.
  std::vector<std::pair<std::string, double>> moe_losses;
  // --moe-per-layer-logging: the same losses per layer (averaged over microbatches, not layers), by global layer index
  // over every layer of the model (a dense layer's 0), as Megatron's tracker holds them.
  std::vector<std::pair<std::string, std::vector<double>>> moe_layer_losses;
  double expert_tokens_min = -1, expert_tokens_mean = 0, expert_tokens_max = 0, dropped_fraction = 0;
  double routing_digest = 0;  // the layers' routing digests summed over every rank (cpu::MoeLayerStats)
};

class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;
  // The training state a checkpoint resumed (iteration 0 when none was loaded).
  virtual TrainState resumed() const = 0;
  // Lines that describe the engine's model and memory, printed once by rank 0.
  virtual std::vector<std::string> describe() const = 0;
  // Runs (or queues) one iteration: the schedule over `num_microbatches` microbatches of this DP rank from
  // global sample `first_sample` on, the gradient reductions, and the optimizer step at learning rate lr.
  virtual void step(int64_t iteration, int64_t first_sample, int64_t num_microbatches, double lr) = 0;
  // True when step() knows its result at once (the CPU engine: the loop reads every iteration); else the loop
  // reads at log intervals, evaluations and saves (the CUDA engine: no host wait inside a step).
  virtual bool reports_each_step() const = 0;
  // The iterations stepped since the last call, in order; waits for them.
  virtual std::vector<StepReport> read_reports() = 0;
  // After read_reports: fp16's loss scale after the last step (1 otherwise).
  virtual double loss_scale() const = 0;
  virtual double params_norm() = 0;
  // Whether any rank passes true (a collective over the world: every rank calls it, at the same iteration).
  virtual bool any_rank(bool mine) = 0;
  // The mean loss over --eval-iters evaluation batches (--eval-global-batch-size samples in microbatches of
  // --eval-micro-batch-size each) of `split` from its sample `first_sample` on, over every token of them (all DP ranks').
  virtual double evaluate(int64_t iteration, Split split, int64_t first_sample) = 0;
  // Writes the checkpoint of `state` (iteration, samples, counts from the loop; the engine adds its own).
  virtual void save(TrainState state) = 0;
  // Peak dense 16-bit TFLOP/s of one device for MFU (<= 0: unknown, no MFU).
  virtual double peak_tflops() const { return -1; }
  // The device memory (log_line.h; reserved < 0: not measured, the CPU engine). Called by every rank at each log
  // interval, after read_reports (a collective over the world where implemented).
  virtual DeviceMemory device_memory(int64_t /*iteration*/) { return {}; }
  // The end of training: every queued step, gather and save done.
  virtual void finish() = 0;
  virtual std::shared_ptr<GPTModel> cpu_model() const { return nullptr; }
};

TrainResult run_training_loop(const Config& cfg, const ProcessGroups& groups, TrainingEngine& engine, const TokenSource& data,
                              const TrainOptions& opt);

// The "loaded ..." / "no checkpoint yet" lines of a resume (rank 0 only).
void announce_load(const Config& cfg, const TrainState& state, bool loaded, bool lead);

}  // namespace mt
