// capabilities.h: what this build can train. Flags that are accepted (they are Megatron's) but whose
// feature is not implemented yet are refused here, loudly, before any work starts.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

// One line per unsupported feature in use, naming the flag and what to do instead.
std::vector<std::string> unsupported_features(const Config& cfg, int64_t world_size, bool cuda_engine = false);
// One note per accepted flag that changes nothing in this engine (printed once at start).
std::vector<std::string> inert_flag_notes(const Config& cfg, bool cuda_engine = false);
// What the CUDA engine cannot run in this configuration, one line each naming the flag and the way out
// (empty: it can); a build without the CUDA backend says so.
std::vector<std::string> cuda_engine_gaps(const Config& cfg, int64_t world_size);

}  // namespace mt
