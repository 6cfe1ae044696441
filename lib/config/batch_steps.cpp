// batch_steps.cpp
#include "config/batch_steps.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace mt {
namespace {

// Megatron's _parse_numeric_value: int(float(value) * multiplier), the suffix case-insensitive.
int64_t parse_value(std::string v, const std::string& entry) {
  const auto not_space = [](unsigned char ch) { return !std::isspace(ch); };
  v.erase(v.begin(), std::find_if(v.begin(), v.end(), not_space));
  v.erase(std::find_if(v.rbegin(), v.rend(), not_space).base(), v.end());
  for (char& ch : v) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double multiplier = 1;
  if (!v.empty()) {
    const char last = v.back();
    multiplier = last == 'T' ? 1e12 : last == 'B' ? 1e9 : last == 'M' ? 1e6 : last == 'K' ? 1e3 : 1;
    if (multiplier != 1) v.pop_back();
  }
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !(x * multiplier >= -9.2e18 && x * multiplier <= 9.2e18)) {
    throw std::invalid_argument("entry '" + entry + "' has no number where '" + v + "' stands (THRESHOLD:BATCH, e.g. 250B:1536)");
  }
  return static_cast<int64_t>(x * multiplier);
}

}  // namespace

std::vector<BatchStep> parse_batch_steps(const std::string& schedule, int64_t seq_length) {
  std::string text = schedule;
  std::replace(text.begin(), text.end(), ',', ' ');
  std::vector<BatchStep> steps;
  size_t at = 0;
  while (at < text.size()) {
    while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
    size_t end = at;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    if (end == at) break;
    const std::string entry = text.substr(at, end - at);
    at = end;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) throw std::invalid_argument("entry '" + entry + "' has no ':' (THRESHOLD:BATCH, e.g. 250B:1536)");
    BatchStep step;
    step.from_samples = parse_value(entry.substr(0, colon), entry);
    step.batch = parse_value(entry.substr(colon + 1), entry);
    if (seq_length > 0) step.from_samples /= seq_length;  // (tokens to samples, as Megatron's threshold // seq_length)
    steps.push_back(step);
  }
  if (steps.empty()) throw std::invalid_argument("the schedule has no entries (THRESHOLD:BATCH ..., e.g. \"0:768 250B:1536\")");
  std::stable_sort(steps.begin(), steps.end(), [](const BatchStep& a, const BatchStep& b) { return a.from_samples < b.from_samples; });
  if (steps.front().from_samples != 0) {
    throw std::invalid_argument("the first threshold must be 0, got " + std::to_string(steps.front().from_samples) + " samples");
  }
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].from_samples <= steps[i - 1].from_samples) {
      throw std::invalid_argument("the thresholds must be strictly increasing in samples (tokens / the sequence length), got " +
                                  std::to_string(steps[i - 1].from_samples) + " before " + std::to_string(steps[i].from_samples));
    }
  }
  for (const BatchStep& s : steps) {
    if (s.batch <= 0) throw std::invalid_argument("every batch size must be positive, got " + std::to_string(s.batch));
  }
  return steps;
}

}  // namespace mt
