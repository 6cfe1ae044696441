// checkpoint_files.h: the file-level pieces a checkpoint's save and load share: checksums, the directory names of
// iterations, synced writes, and a small thread pool for per-piece work.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace mt::checkpoint_files {

// 64-bit checksum over 8-byte words (fast enough to verify tens of GB), then the tail bytes.
uint64_t checksum64(const void* data, size_t n);
// Runs f(i) for i in [0, n) on up to 16 threads (checksums, copies and tensor assembly are independent).
void parallel_for(size_t n, const std::function<void(size_t)>& f);
std::string hex(uint64_t v);
std::string iter_name(int64_t it);  // iter_0000123
void fsync_path(const std::filesystem::path& p, bool directory);
// Writes and fsyncs a file; a DataError naming it on failure.
void write_file_synced(const std::filesystem::path& p, const void* data, size_t n);

}  // namespace mt::checkpoint_files
