// validate.h: Megatron's configuration rules (shared/REFERENCE.md section 2) plus megatrain's own.
// Every violation is reported at once; each message names the numbers and a fix.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

struct Diagnostics {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
  bool ok() const { return errors.empty(); }
};

enum class Purpose {
  kPrint,  // --print-config: model and factorisation rules, world size as given
  kPlan,   // megatrain plan: everything a layout needs
  kTrain,  // training: also data source, schedule, learning rate
};

Diagnostics validate(const Config& cfg, int64_t world_size, Purpose purpose);
// After resolve(): the embedding's rows (--padded-vocab-size, --no-pad-vocab-size) against the vocabulary and TP.
Diagnostics validate_vocabulary(const Config& resolved);

}  // namespace mt
