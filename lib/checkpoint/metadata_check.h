// metadata_check.h: a checkpoint's metadata.json checked before anything trusts it. Every field the loader
// and `checkpoint inspect --verify` read is typed and in range: iterations and counters non-negative (and
// the iteration the directory's), each piece's file one of the shards, its bytes inside that file and not
// overlapping another piece there, its slice inside the global shape and its shard rank inside its count;
// pieces of one slice do not overlap. Each error names the file, the tensor and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace mt {

// Throws DataError on the first problem. `metadata` is the file's path (named in the errors), `iteration`
// the one the directory's name and the tracker give.
void check_checkpoint_metadata(const nlohmann::json& meta, const std::filesystem::path& metadata, int64_t iteration);

}  // namespace mt
