// fuzz_recipe.cpp: libFuzzer target for YAML recipes. Any input applied as a recipe must configure or throw
// ConfigError (bad YAML, unknown keys, bad values, duplicates, alias bombs), never crash or hang.
#include <cstdint>
#include <string>

#include "config/config.h"
#include "config/errors.h"
#include "config/yaml_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mt::Config cfg;
  try {
    mt::apply_yaml_text(cfg, std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  } catch (const mt::ConfigError&) {
  }
  return 0;
}
