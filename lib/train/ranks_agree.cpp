// ranks_agree.cpp: the configurations compared line by line of their YAML form.
#include "train/ranks_agree.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "config/errors.h"
#include "config/yaml_io.h"

namespace mt {
namespace {

// This build (binaries built apart disagree even with the same flags).
const char* build_id() { return __DATE__ " " __TIME__; }

// "num_layers: 4" as the flag a user types, "--num-layers 4" (the value alone with `value_only`).
std::string as_flag(const std::string& line, bool value_only) {
  const size_t colon = line.find(": ");
  if (colon == std::string::npos) return line;
  std::string key = line.substr(0, colon);
  for (char& c : key) {
    if (c == '_') c = '-';
  }
  const std::string value = line.substr(colon + 2);
  return value_only ? value : "--" + key + " " + value;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') out.push_back(line);
  }
  return out;
}

}  // namespace

void check_ranks_agree(const Config& cfg, Communicator& world) {
  if (world.size() == 1) return;
  const std::string mine = std::string("build: ") + build_id() + "\n" + config_to_yaml(cfg);
  // A digest first (what every start-up pays: 16 bytes a rank), the whole texts only when they differ.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : mine) {
    h ^= c;
    h *= 1099511628211ull;
  }
  const std::vector<std::string> digests = world.all_gather_strings(std::to_string(h));
  if (std::all_of(digests.begin(), digests.end(), [&](const std::string& d) { return d == digests.front(); })) return;
  const std::vector<std::string> all = world.all_gather_strings(mine);
  std::string problems;
  int differing = 0;
  const std::vector<std::string> first = lines_of(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    ++differing;
    if (differing > 3) continue;  // the first few ranks are enough to see what happened
    const std::vector<std::string> other = lines_of(all[r]);
    std::string settings;
    int shown = 0;
    for (size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const std::string a = i < first.size() ? first[i] : "", b = i < other.size() ? other[i] : "";
      if (a == b) continue;
      if (++shown > 4) break;
      settings += (settings.empty() ? "" : "; ") + as_flag(b, false) + " (rank 0: " + as_flag(a, true) + ")";
    }
    problems += (problems.empty() ? "" : " | ") + std::string("rank ") + std::to_string(r) + ": " + settings;
  }
  if (differing == 0) return;
  throw ConfigError("the ranks were launched with different configurations (" + std::to_string(differing) + " rank(s) differ from rank 0): " + problems +
                    ": give every rank the same flags, recipe and megatrain binary");
}

}  // namespace mt
