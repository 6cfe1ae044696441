// trainer.cpp: training on the reference engine: the shared loop over the CPU engine.
#include "train/trainer.h"

#include "train/cpu_engine.h"
#include "train/ranks_agree.h"
#include "train/train_common.h"
#include "train/training_loop.h"

namespace mt {

TrainResult train(const Config& cfg, ProcessGroups groups, const TrainOptions& opt) {
  check_ranks_agree(cfg, groups.checkpoint ? *groups.checkpoint : *groups.world);
  auto data = open_training_data(cfg);
  CpuEngine engine(cfg, groups, *data, opt.rank == 0 && !opt.quiet);
  return run_training_loop(cfg, groups, engine, *data, opt);
}

}  // namespace mt
