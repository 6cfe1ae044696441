// fuzz_file.h: the tokenizer fuzz targets' inputs written to a file of this process (the loaders take paths).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

// Writes `size` bytes to /tmp/megatrain-fuzz-PID-NAME and returns the path.
inline std::string write_fuzz_file(const std::string& name, const void* data, size_t size) {
  const std::string path = "/tmp/megatrain-fuzz-" + std::to_string(getpid()) + "-" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
