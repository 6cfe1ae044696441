// cuda_trainer.cpp: training on the CUDA engine: the shared loop over CudaEngine.
#include "train/cuda_trainer.h"

#include "train/cuda_engine.h"
#include "train/ranks_agree.h"
#include "train/train_common.h"
#include "train/training_loop.h"

namespace mt {

TrainResult train_cuda(const Config& cfg, ProcessGroups groups, const TrainOptions& opt) {
  check_ranks_agree(cfg, groups.checkpoint ? *groups.checkpoint : *groups.world);
  auto data = open_training_data(cfg);
  CudaEngine engine(cfg, groups, *data, opt.rank == 0 && !opt.quiet);
  return run_training_loop(cfg, groups, engine, *data, opt);
}

}  // namespace mt
