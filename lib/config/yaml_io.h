// yaml_io.h: recipes. Loading a YAML recipe onto a Config (keys are flag names with dashes or
// underscores, optionally nested in sections) and printing a Config as YAML that loads back the same.
#pragma once

#include <string>

#include "config/config.h"

namespace mt {

// Applies every key of the recipe at `path` to cfg. Unknown keys and wrong types throw ConfigError.
void apply_yaml_file(Config& cfg, const std::string& path);
void apply_yaml_text(Config& cfg, const std::string& text, const std::string& source);

// The whole configuration, one key per flag, grouped by Megatron's argument groups.
std::string config_to_yaml(const Config& cfg);

}  // namespace mt
