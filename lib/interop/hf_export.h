// hf_export.h: a megatrain checkpoint, saved in any layout, as a HuggingFace model directory: config.json,
// generation_config.json, safetensors (sharded past --max-shard-size, with model.safetensors.index.json) under
// HF's tensor names and layouts, and the tokenizer files the run used. Families: GPT-2 (GPT2LMHeadModel),
// LLaMA 2 / 3 and Mistral-shaped models (LlamaForCausalLM: Q, K and V split out of Megatron's grouped QKV rows,
// gate and up apart), Mixtral (MixtralForCausalLM). A model those classes cannot express is refused, naming why.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "model/gpt_model.h"

namespace mt {

struct HfExportOptions {
  std::string checkpoint_dir;
  std::optional<int64_t> step;
  std::string out_dir;
  std::string dtype = "bf16";            // bf16 | fp32
  int64_t max_shard_bytes = 5000000000;  // HF's default 5 GB
};

// Writes the directory; returns what was written (one line each) and notes.
std::vector<std::string> export_hf(const HfExportOptions& opt);

// The checkpoint's model on one rank (TP, PP, EP 1) with fp32 weights as saved (the master weights): what
// export reads, and what a test computes megatrain's loss with.
struct SingleRankModel {
  Config cfg;
  CheckpointInfo info;
  std::unique_ptr<GPTModel> model;
};
SingleRankModel load_single_rank(const std::string& dir, std::optional<int64_t> step);

}  // namespace mt
