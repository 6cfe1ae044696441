// cuda_trainer_none.cpp: a build without the CUDA backend has no CUDA engine; train_cmd never selects it
// there (built_with_cuda() is false), and a direct call says why.
#include <stdexcept>

#include "train/cuda_trainer.h"

namespace mt {

TrainResult train_cuda(const Config&, ProcessGroups, const TrainOptions&) {
  throw std::runtime_error("this build has no CUDA backend: reconfigure where nvcc and cuDNN are installed");
}

}  // namespace mt
