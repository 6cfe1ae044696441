// checkpoint_cmd.cpp: `megatrain checkpoint inspect DIR [--ckpt-step K] [--verify]` and
// `megatrain checkpoint export DIR --hf OUT [--ckpt-step K] [--dtype bf16|fp32] [--max-shard-size 5GB]` and
// `megatrain checkpoint import --hf DIR --save CKPT`.
#include <cctype>
#include <cmath>
#include <iostream>

#include <CLI/CLI.hpp>

#include "checkpoint/checkpoint.h"
#include "commands.h"
#include "config/errors.h"
#include "interop/hf_export.h"
#include "interop/hf_import.h"

namespace mt {
namespace {

// HF's sizes: "5GB" is 5 x 10^9 bytes (KB, MB, GB, TB powers of 1000; KiB, MiB, GiB powers of 1024; plain bytes).
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  const double v = std::stod(text, &used);
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                                                  {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [u, f] : units) {
    if (unit == u) {
      const double bytes = v * f;
      return std::isfinite(bytes) && bytes >= 1 && bytes < 9e18 ? static_cast<int64_t>(bytes) : -1;
    }
  }
  return -1;
}

}  // namespace

int run_checkpoint(int argc, char** argv) {
  CLI::App app{"megatrain checkpoint: inspect checkpoints, export them to HuggingFace and import HuggingFace models", "megatrain checkpoint"};
  app.require_subcommand(1);
  auto* inspect = app.add_subcommand("inspect", "Print iteration, layout, tensors and sizes of a checkpoint");
  std::string dir;
  int64_t step = -1;
  bool verify = false;
  inspect->add_option("dir", dir, "Checkpoint directory (the --save directory)")->required();
  inspect->add_option("--ckpt-step", step, "Iteration to inspect (default: the latest)");
  inspect->add_flag("--verify", verify, "Read every shard and verify its checksum");
  auto* exp = app.add_subcommand("export", "Write a checkpoint (any layout) as a HuggingFace model: config.json, safetensors, tokenizer files");
  std::string export_dir, hf_out, dtype = "bf16", shard = "5GB";
  int64_t export_step = -1;
  exp->add_option("dir", export_dir, "Checkpoint directory (the --save directory)")->required();
  exp->add_option("--hf", hf_out, "Output directory for the HuggingFace model")->required();
  exp->add_option("--ckpt-step", export_step, "Iteration to export (default: the latest)");
  exp->add_option("--dtype", dtype, "Weights' type in the safetensors files")->check(CLI::IsMember({"bf16", "fp32"}));
  exp->add_option("--max-shard-size", shard, "Largest safetensors file before sharding (e.g. 5GB, 500MB)");
  auto* imp = app.add_subcommand(
      "import", "Write a HuggingFace model (GPT-2, LLaMA, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE) as a megatrain checkpoint at iteration 0");
  std::string import_hf_dir, import_save;
  imp->add_option("--hf", import_hf_dir, "HuggingFace model directory (config.json and safetensors)")->required();
  imp->add_option("--save", import_save, "Checkpoint directory to write (train with --load it --finetune)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (imp->parsed()) {
    try {
      for (const auto& line : import_hf({import_hf_dir, import_save})) std::cout << line << "\n";
    } catch (const std::exception& e) {
      std::cerr << "megatrain: error: " << e.what() << "\n";
      return 1;
    }
    return 0;
  }
  if (exp->parsed()) {
    HfExportOptions o;
    o.checkpoint_dir = export_dir;
    o.out_dir = hf_out;
    o.dtype = dtype;
    if (export_step >= 0) o.step = export_step;
    try {
      o.max_shard_bytes = parse_size(shard);
    } catch (const std::exception&) {
      o.max_shard_bytes = -1;
    }
    if (o.max_shard_bytes <= 0) {
      std::cerr << "megatrain: error: --max-shard-size " << shard << " is not a size: give e.g. 5GB or 500MB\n";
      return 1;
    }
    try {
      for (const auto& line : export_hf(o)) std::cout << line << "\n";
    } catch (const std::exception& e) {
      std::cerr << "megatrain: error: " << e.what() << "\n";
      return 1;
    }
    return 0;
  }
  std::cout << inspect_checkpoint(dir, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, verify);
  return 0;
}

}  // namespace mt
