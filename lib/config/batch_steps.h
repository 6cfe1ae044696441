// batch_steps.h: Megatron's --step-batch-size-schedule ("THRESHOLD:BATCH THRESHOLD:BATCH ...", its
// StepBatchsizeNumMicroBatchesCalculator): entries separated by spaces or commas, each value an integer or a
// decimal with an optional K, M, B or T suffix (1e3, 1e6, 1e9, 1e12; truncated to an integer), the thresholds
// in tokens, turned into samples by integer division by the sequence length, sorted; the first at 0 samples,
// strictly increasing, every batch size positive. From a threshold on, the global batch is its batch size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct BatchStep {
  int64_t from_samples = 0;  // the consumed samples from which this batch size holds
  int64_t batch = 0;         // the global batch size
};

// Throws std::invalid_argument naming the entry and the rule it breaks.
std::vector<BatchStep> parse_batch_steps(const std::string& schedule, int64_t seq_length);

}  // namespace mt
