// checkpoint_cmd.cpp: `megatrain checkpoint inspect DIR [--ckpt-step K] [--verify]`.
#include <iostream>

#include <CLI/CLI.hpp>

#include "checkpoint/checkpoint.h"
#include "commands.h"

namespace mt {

int run_checkpoint(int argc, char** argv) {
  CLI::App app{"megatrain checkpoint: inspect checkpoints", "megatrain checkpoint"};
  app.require_subcommand(1);
  auto* inspect = app.add_subcommand("inspect", "Print iteration, layout, tensors and sizes of a checkpoint");
  std::string dir;
  int64_t step = -1;
  bool verify = false;
  inspect->add_option("dir", dir, "Checkpoint directory (the --save directory)")->required();
  inspect->add_option("--ckpt-step", step, "Iteration to inspect (default: the latest)");
  inspect->add_flag("--verify", verify, "Read every shard and verify its checksum");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::cout << inspect_checkpoint(dir, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, verify);
  return 0;
}

}  // namespace mt
