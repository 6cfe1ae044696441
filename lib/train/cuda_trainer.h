// cuda_trainer.h: the training loop on the CUDA engine (one GPU per rank): the same Megatron loop as
// trainer.h (schedule, LR, logging, metrics file, validation, checkpoints) with the model, the gradients
// and the optimizer state on the device. The host never waits for the device inside a step: the loss,
// the gradient norm and the skip decision stay on the device and are read at log intervals.
#pragma once

#include "train/trainer.h"

namespace mt {

TrainResult train_cuda(const Config& cfg, ProcessGroups groups, const TrainOptions& opt = {});

}  // namespace mt
