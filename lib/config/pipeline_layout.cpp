// pipeline_layout.cpp: Megatron's PipelineParallelLayerLayout.parse_str_to_list and validate_layer_layout.
#include "config/pipeline_layout.h"

#include <cctype>

#include "config/errors.h"

namespace mt {
namespace {

// One of Megatron's two unrolling passes over the whole string (re.sub, left to right, no overlaps): "(body)*n" with
// a body free of parentheses, or "x*n" for one character x.
std::string unroll(const std::string& in, bool groups) {
  std::string out;
  size_t i = 0;
  while (i < in.size()) {
    size_t body_begin = i, body_end = i, star = std::string::npos;
    if (groups && in[i] == '(') {
      const size_t close = in.find(')', i + 1);
      if (close != std::string::npos && close > i + 1 && in.find('(', i + 1) > close && close + 1 < in.size() && in[close + 1] == '*') {
        body_begin = i + 1;
        body_end = close;
        star = close + 1;
      }
    } else if (!groups && i + 1 < in.size() && in[i + 1] == '*') {
      body_begin = i;
      body_end = i + 1;
      star = i + 1;
    }
    size_t digits_end = star == std::string::npos ? star : star + 1;
    while (digits_end != std::string::npos && digits_end < in.size() && std::isdigit(static_cast<unsigned char>(in[digits_end]))) ++digits_end;
    if (star == std::string::npos || digits_end == star + 1) {  // (no repeat here: the character as it is)
      out += in[i++];
      continue;
    }
    const std::string count_text = in.substr(star + 1, digits_end - star - 1);
    if (count_text.size() > 6) throw ConfigError("--pipeline-model-parallel-layout: the repeat count " + count_text + " is too large");
    const int64_t count = std::stoll(count_text);
    for (int64_t k = 0; k < count; ++k) out += in.substr(body_begin, body_end - body_begin);
    if (out.size() > 1000000) throw ConfigError("--pipeline-model-parallel-layout unrolls to more than a million layers: check its repeats");
    i = digits_end;
  }
  return out;
}

}  // namespace

std::vector<PipelineLayoutStage> parse_pipeline_layout(const std::string& layout) {
  std::string text;
  for (char ch : layout) {
    if (ch != ',') text += ch;  // (commas are cosmetic)
  }
  text = unroll(unroll(text, true), false);
  std::vector<PipelineLayoutStage> stages(1);
  for (char ch : text) {
    if (ch == '|') {
      stages.emplace_back();
    } else if (ch == 'E' || ch == 'L' || ch == 't' || ch == 'm') {
      stages.back().layers += ch;
    } else {
      throw ConfigError(std::string("--pipeline-model-parallel-layout: invalid layer character '") + ch + "' in \"" + layout +
                        "\" (Megatron's: E embedding, t transformer layer, m MTP layer, L loss, | between stages, (...)*n and x*n repeats)");
    }
  }
  return stages;
}

int64_t PipelineLayoutStage::count(char layer) const {
  int64_t n = 0;
  for (char ch : layers) n += ch == layer ? 1 : 0;
  return n;
}

std::string pipeline_layout_problems(const std::vector<PipelineLayoutStage>& stages, int64_t pipeline_size, int64_t num_layers,
                                     int64_t mtp_layers) {
  std::string out;
  auto problem = [&](const std::string& m) {
    if (!out.empty()) out += '\n';
    out += "--pipeline-model-parallel-layout: ";
    out += m;
  };
  const auto n = static_cast<int64_t>(stages.size());
  if (pipeline_size < 1 || n % pipeline_size != 0) {
    problem("its " + std::to_string(n) + " stages are not divisible by --pipeline-model-parallel-size " + std::to_string(pipeline_size) +
            " (each rank takes the same number of virtual stages)");
  }
  std::string flat;  // (Megatron's flattened layout: the stages in order)
  int64_t empty = 0;
  for (const auto& st : stages) {
    flat += st.layers;
    empty += st.empty() ? 1 : 0;
  }
  const PipelineLayoutStage all{flat};
  const int64_t embeddings = all.count('E'), losses = all.count('L'), layers = all.count('t'), mtp = all.count('m');
  if (embeddings != 1) problem("the embedding E must appear exactly once, got " + std::to_string(embeddings));
  if (losses != 1) problem("the loss L must appear exactly once, got " + std::to_string(losses));
  if (!flat.empty() && embeddings == 1 && flat.front() != 'E') problem("the first layer must be the embedding E");
  if (!flat.empty() && losses == 1 && flat.back() != 'L') problem("the last layer must be the loss L");
  if (layers != num_layers) {
    problem("it holds " + std::to_string(layers) + " transformer layers (t), --num-layers is " + std::to_string(num_layers));
  }
  // Multi-token prediction's modules (Megatron's checks): as many m's as --mtp-num-layers, after every transformer layer,
  // all in one stage. Megatron also runs them in a stage of their own before the loss's (its standalone MTP stage, whose
  // hidden states travel on beside the model's); megatrain runs them in the loss's stage only.
  if (mtp != mtp_layers) {
    problem("it holds " + std::to_string(mtp) + " multi-token prediction layers (m), --mtp-num-layers is " + std::to_string(mtp_layers) +
            " (Megatron's rule: the layout places every module)");
  }
  if (mtp > 0) {
    if (flat.find('m') < flat.rfind('t') && flat.rfind('t') != std::string::npos) {
      problem("the multi-token prediction layers (m) must come after every transformer layer (t)");
    }
    int64_t holding = 0;  // (the stages with an m)
    bool with_loss = false;
    for (const auto& st : stages) {
      if (st.count('m') == 0) continue;
      ++holding;
      with_loss = with_loss || st.count('L') > 0;
    }
    if (holding > 1) problem("the multi-token prediction layers (m) must all be in one stage (as Megatron's)");
    if (holding == 1 && !with_loss) {
      problem("the multi-token prediction layers (m) in a stage before the loss's (Megatron's standalone MTP stage) are not implemented: "
              "put them in the loss's stage, e.g. \"...|tmL\"");
    }
  }
  if (empty > 0) {
    problem(std::to_string(empty) + " stage(s) hold nothing, which megatrain does not run: give every stage a layer, the embedding or the loss");
  }
  return out;
}

}  // namespace mt
