// train_cmd.cpp: `megatrain [train]`.
#include <iostream>

#include "commands.h"
#include "config/errors.h"
#include "config/yaml_io.h"
#include "config_setup.h"
#include "parallel/launcher.h"

namespace mt {

int run_train(int argc, char** argv) {
  CLI::App app{"megatrain: train a GPT / LLaMA / Mixtral-style model with Megatron-LM's flags", "megatrain"};
  ConfigCli cli(app);
  const LaunchInfo launch = detect_launch();
  Config cfg = setup_config(app, cli, argc, argv, launch.world_size, Purpose::kTrain, launch.rank == 0);
  if (cli.print_config()) {
    if (launch.rank == 0) std::cout << config_to_yaml(cfg);
    return 0;
  }
  throw ConfigError("training is not available in this build yet");
}

}  // namespace mt
