// token_source.h: where training samples come from. A sample is seq+1 consecutive tokens addressed
// by its global index, so every rank reads exactly its own microbatches and the data position is
// just the number of consumed samples.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/config.h"
#include "model/model_dims.h"

namespace mt {

enum class Split { kTrain, kValid, kTest };

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Writes `len` tokens of sample `index` of `split` into out.
  virtual void sample(Split split, int64_t index, int64_t len, int32_t* out) const = 0;
  virtual int64_t vocab_size() const = 0;  // before padding
  virtual int32_t eod() const = 0;
  virtual bool has_split(Split split) const = 0;
  virtual std::string describe() const = 0;
};

// Samples [first_sample, first_sample + B) as one microbatch: inputs, next-token labels, positions
// (restarting after EOD with --reset-position-ids) and the loss mask (EOD masked with --eod-mask-loss).
Microbatch make_microbatch(const TokenSource& src, Split split, int64_t first_sample, int64_t B, int64_t S,
                          const Config& cfg);

// Builds the source the config names (--mock-data or --text-data-path). Throws ConfigError on bad input.
std::unique_ptr<TokenSource> make_token_source(const Config& cfg);

}  // namespace mt
