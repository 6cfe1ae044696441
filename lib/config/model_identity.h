// model_identity.h: the settings that make a model the function it is (heads, query groups, head size, norm,
// activation, positions, rotary settings, biases, tied embeddings, experts, ...), by flag name. A checkpoint
// of another model can have the same tensor shapes (8 heads of 64 instead of 4 of 128); the loader compares
// these with the run's and refuses a difference with the settings named.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace mt {

// (flag name, value) of a resolved configuration's architecture settings.
std::vector<std::pair<std::string, std::string>> model_identity(const Config& cfg);
// The settings where `saved` and `run` differ, as "--flag: checkpoint X, this run Y" (empty: the same model).
std::vector<std::string> model_identity_differences(const Config& saved, const Config& run);

}  // namespace mt
