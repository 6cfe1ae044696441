// schedule.h: pipeline schedules as lists of actions per rank, engine-independent, and the one executor that
// runs a list over this rank's stage (pipeline/stage.h). An action is the forward, the backward (whole, or
// its input-gradient half B with the weight-gradient half W apart) of one (microbatch, model chunk), or a
// send / receive of the activations or gradients at a stage boundary. Megatron's no-pipelining, 1F1B and
// interleaved 1F1B schedules and the zero-bubble ZB-H1 are lists for the same executor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mt {

class PipelineStage;

enum class ActionKind {
  kForward,
  kBackward,        // input and weight gradients together
  kBackwardInput,   // B: the input gradients only; its W follows later
  kBackwardWeight,  // W: the weight gradients of an earlier B
  kSendForward,
  kRecvForward,
  kSendBackward,
  kRecvBackward,
};

struct ScheduleAction {
  ActionKind kind = ActionKind::kForward;
  int64_t microbatch = 0;
  int64_t chunk = 0;  // the model chunk (virtual stage) on this rank
};
using Schedule = std::vector<ScheduleAction>;

std::string action_name(const ScheduleAction& a);  // "F3", "B3", "W3", "SF3", ... (chunk as ".c" when > 0)

// Megatron's forward_backward_no_pipelining: each microbatch's forward, then its backward, on one stage.
// split_weights: each backward as B then W (the same gradients; what zero-bubble schedules reorder).
Schedule no_pipelining_schedule(int64_t num_microbatches, bool split_weights = false);

// Megatron's 1F1B (forward_backward_pipelining_without_interleaving) for stage `rank` of `stages`: a warm-up of
// min(stages - rank - 1, M) forwards, the steady state of one forward and one backward, and a cool-down of the
// warm-up's backwards, with the receives and sends of the stage boundaries (none beyond the first and last
// stage). split_weights: each backward as B then W (the same gradients in the same order; W runs while the
// transfers that follow its B are in flight).
Schedule one_f_one_b_schedule(int64_t rank, int64_t stages, int64_t num_microbatches, bool split_weights = false);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B's forwards and input-gradient
// halves B, with each weight-gradient half W deferred to fill the bubbles (stage r runs W of microbatch
// x - (stages - 1) where 1F1B runs the backward of x - (stages - 1 - r)); no stage holds more microbatches
// than 1F1B's first stage.
Schedule zero_bubble_h1_schedule(int64_t rank, int64_t stages, int64_t num_microbatches);

// Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving): each rank holds `chunks` model
// chunks (virtual stage c x stages + rank for chunk c); groups of `group` microbatches (Megatron's
// --microbatch-group-size-per-virtual-pipeline-stage; 0: `stages`, its default) pass through the chunks in turn, after a
// warm-up of (stages - rank - 1) x 2 + (chunks - 1) x group forwards. The group must range in [stages, microbatches] and
// leave a last group of none or at least `stages` microbatches (std::logic_error otherwise). chunks = 1 is 1F1B.
Schedule interleaved_schedule(int64_t rank, int64_t stages, int64_t chunks, int64_t num_microbatches, int64_t group = 0);

// Forwards only (evaluation): each microbatch received, forwarded and sent on, stage by stage (chunk by chunk
// in the interleaved order, its groups as interleaved_schedule's).
Schedule forward_only_schedule(int64_t rank, int64_t stages, int64_t num_microbatches, int64_t chunks = 1, int64_t group = 0);

// Empty when every (microbatch, chunk) of [0, num_microbatches) x [0, num_chunks) runs its forward once, then
// its backward once (or a B, then a W), and nothing else is in the list; else what is wrong.
std::string check_schedule(const Schedule& schedule, int64_t num_microbatches, int64_t num_chunks);
// Empty when the stages' lists (schedules[r] for rank r of a pipeline, `chunks` model chunks each) run to the
// end with blocking batched transfers: every run of consecutive transfers of a rank completes once each of
// its sends and receives meets its partner on the neighbouring rank, the messages between two ranks meeting
// in the order posted (as the communicators match them); else the first rank and action that can never
// complete (a deadlock), or a transfer that meets the wrong partner.
std::string check_pipeline(const std::vector<Schedule>& schedules, int64_t chunks = 1);
// The same run with a clock per rank: compute actions take cost(rank, action) (1 each when empty), a run of
// transfers completes when its last partner is posted (no transfer time), the weight-gradient passes right
// after a run overlap it (as run_schedule runs them). makespan: when the last rank finishes; busy: the compute
// summed over the ranks; bubble(): the idle fraction.
using ActionCost = std::function<double(int64_t rank, const ScheduleAction& action)>;
struct PipelineTiming {
  std::string error;  // check_pipeline's
  double makespan = 0, busy = 0;
  double bubble(int64_t ranks) const { return makespan > 0 ? 1.0 - busy / (makespan * static_cast<double>(ranks)) : 0.0; }
};
PipelineTiming simulate_pipeline(const std::vector<Schedule>& schedules, int64_t chunks, const ActionCost& cost);
// The most (microbatch, chunk) pairs whose forward has run and whose backward (W included) has not, at any point.
int64_t peak_in_flight(const Schedule& schedule);

// Runs the actions in order on `stage`. A chunk's last backward (B or whole) is flagged to the stage, so that
// the iteration's reductions run with it, and so is its last W (the reductions that follow weight gradients);
// before_last_backward runs just before the first of the chunks' last backwards, the first that makes
// gradients final (data parallelism arms its overlapped gradient reduction there).
void run_schedule(const Schedule& schedule, PipelineStage& stage, const std::function<void()>& before_last_backward = {});

}  // namespace mt
