// pipeline_layout.h: Megatron's --pipeline-model-parallel-layout, an explicit list of the (virtual) pipeline stages'
// layers: "E" the embedding, "t" a transformer layer, "m" a multi-token-prediction layer, "L" the loss; stages split
// by "|", "(...)*n" and "x*n" repeat, commas are cosmetic. "Et*3|(tt|)*6L" is [E t t t] [t t] x 6 [L]. The stages are
// virtual stages in order: stage v belongs to pipeline rank v % PP as its chunk v / PP.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mt {

struct PipelineLayoutStage {
  std::string layers;  // its layer characters in order (E, t, m, L)
  int64_t count(char layer) const;
  bool empty() const { return layers.empty(); }
};

// The stages of a layout string, Megatron's parse (ConfigError on a character other than E, t, m, L and the
// operators, or a malformed repeat).
std::vector<PipelineLayoutStage> parse_pipeline_layout(const std::string& layout);

// Megatron's checks of a parsed layout against the model (validate_layer_layout) and what megatrain runs: "" when it
// fits, else every problem, one per line. `mtp_layers`: --mtp-num-layers (0 without), whose modules the layout places
// with its m's: after every transformer layer, all in one stage, here the loss's (Megatron's "...tmL").
std::string pipeline_layout_problems(const std::vector<PipelineLayoutStage>& stages, int64_t pipeline_size, int64_t num_layers,
                                     int64_t mtp_layers = 0);

}  // namespace mt
