// cli.h: command-line parsing of the flag table with CLI11. Precedence: defaults < YAML recipe
// (--config / --yaml-cfg) < command line. Subcommands add their own options to the same app.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

class ConfigCli {
 public:
  // Registers every flag, its old spellings, --config/--yaml-cfg and --print-config on `app`.
  explicit ConfigCli(CLI::App& app);
  ~ConfigCli();
  // After app.parse(): rejects unknown arguments (naming the nearest flag), then builds the Config.
  Config build() const;
  bool print_config() const { return print_config_; }

 private:
  struct Holder;
  CLI::App& app_;
  std::vector<std::unique_ptr<Holder>> holders_;
  std::string config_path_;
  bool print_config_ = false;
};

// "megatrain ... --num-layrs 2" -> "unknown flag --num-layrs: did you mean --num-layers?"
void reject_unknown_arguments(const std::vector<std::string>& remaining);

}  // namespace mt
