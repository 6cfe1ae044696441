// fuzz_checkpoint_metadata.cpp: libFuzzer target for the checkpoint metadata check. Any input is parsed as
// metadata.json and checked (against a directory without shards): it must pass or throw DataError (or be
// refused as JSON), never crash or read out of bounds (run under AddressSanitizer).
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/metadata_check.h"
#include "config/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  try {
    mt::check_checkpoint_metadata(meta, std::filesystem::path("/nonexistent-fuzz/iter_0000002/metadata.json"), 2);
  } catch (const mt::DataError&) {
  }
  return 0;
}
