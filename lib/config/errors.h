// errors.h: the error types megatrain reports to people. A ConfigError is one line that names the
// problem and the fix; main() prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace mt {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A data file (dataset, tokenizer file, checkpoint) that is missing, truncated or corrupt.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Several problems found at once (validation reports every violation, not the first).
struct ConfigErrors : std::runtime_error {
  explicit ConfigErrors(std::vector<std::string> msgs)
      : std::runtime_error(msgs.empty() ? std::string("invalid configuration") : msgs.front()),
        messages(std::move(msgs)) {}
  std::vector<std::string> messages;
};

// The message of a JSON library exception without the library's "[json.exception.parse_error.101] " prefix:
// what the user reads names the file (the caller's part) and the problem, not the library.
inline std::string json_error_text(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0) {
    const size_t end = m.find("] ");
    if (end != std::string::npos) m = m.substr(end + 2);
  }
  return m;
}

}  // namespace mt
