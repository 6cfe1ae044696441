// hf_import.h: a HuggingFace model directory (GPT2LMHeadModel, LlamaForCausalLM / MistralForCausalLM without a
// sliding window, MixtralForCausalLM, Qwen2 / Qwen3 and their MoE forms) as a megatrain checkpoint at iteration 0, weights only: the model's flags
// come from config.json (one note each), the tensors from the safetensors files by HF's names, transformed into
// megatrain's layouts (the inverse of hf_export). Training then loads it in any layout with --load DIR
// --finetune (or --no-load-optim).
#pragma once

#include <string>
#include <vector>

namespace mt {

struct HfImportOptions {
  std::string hf_dir;
  std::string save_dir;
};

// Writes the checkpoint; returns what was done, the flags the model needs, and notes.
std::vector<std::string> import_hf(const HfImportOptions& opt);

}  // namespace mt
