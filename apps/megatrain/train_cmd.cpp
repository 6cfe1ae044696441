// train_cmd.cpp: `megatrain [train]`: flags and recipe -> validated config -> training.
#include <iostream>

#include "commands.h"
#include "config/errors.h"
#include "config/yaml_io.h"
#include "config_setup.h"
#include "parallel/launcher.h"
#include "tensor/device_info.h"
#include "train/capabilities.h"
#include "train/trainer.h"

namespace mt {

int run_train(int argc, char** argv) {
  CLI::App app{"megatrain: train a GPT / LLaMA / Mixtral-style model with Megatron-LM's flags.\n"
               "Subcommands: megatrain plan --help (layout, memory and time without a GPU).",
               "megatrain"};
  ConfigCli cli(app);
  const LaunchInfo launch = detect_launch();
  const bool lead = launch.rank == 0;
  Config cfg = setup_config(app, cli, argc, argv, launch.world_size, Purpose::kTrain, lead);
  if (cli.print_config()) {
    if (lead) std::cout << config_to_yaml(cfg);
    return 0;
  }
  const auto missing = unsupported_features(cfg, launch.world_size);
  if (!missing.empty()) throw ConfigErrors(missing);
  if (cfg.derived.vocab_size == 0) {
    throw ConfigError("the vocabulary size is unknown: give --vocab-size (with --mock-data / NullTokenizer) or "
                      "--tokenizer-type ByteTokenizer (with --text-data-path)");
  }
  if (lead && cfg.logging.device == "auto") {
    const auto gpus = visible_gpus();
    std::cerr << "megatrain: note: training on the CPU reference engine: "
              << (gpus.empty() ? gpu_unavailable_reason() : gpus.front().name + " is visible, but the CUDA training engine is not in this build yet")
              << "\n";
  }
  train(cfg, ProcessGroups::single(), TrainOptions{false, launch.rank});
  return 0;
}

}  // namespace mt
