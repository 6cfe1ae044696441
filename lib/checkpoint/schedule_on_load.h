// schedule_on_load.h: the learning-rate schedule a checkpoint was saved with, against the one a resuming run asks for,
// as Megatron's OptimizerParamScheduler.load_state_dict checks them: by default they must agree (peak and minimum rate,
// warmup and decay in samples, decay style, weight decay and the training length that its increment spans, and the
// decoupled rates Megatron restores with the optimizer's parameter groups); --override-opt_param-scheduler keeps the
// command's, --use-checkpoint-opt_param-scheduler takes the checkpoint's.
#pragma once

#include <string>

#include "config/config.h"
#include "optim/lr_schedule.h"

namespace mt {

// The schedule as the checkpoint's metadata keeps it ("lr_schedule"), from the resolved configuration.
std::string lr_schedule_to_json(const Config& cfg);

// cfg (resolved) resumes from a checkpoint saved with the schedule saved_json: an error naming the first setting that
// differs and both flags, unless one of them is set; with --use-checkpoint-opt_param-scheduler the schedule's flags
// are set to give the saved schedule (in samples). Returns a note for the run's log, or "" when nothing changed.
std::string reconcile_lr_schedule(Config& cfg, const std::string& saved_json, const std::string& checkpoint_dir);

}  // namespace mt
