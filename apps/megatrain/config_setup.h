// config_setup.h: shared by the subcommands: parse flags (CLI11 + recipe), validate for a purpose,
// print notes and warnings, resolve.
#pragma once

#include <CLI/CLI.hpp>

#include "config/cli.h"
#include "config/config.h"
#include "config/validate.h"

namespace mt {

// Parses argv into the app (exits on --help), builds and validates the config. Throws ConfigErrors
// listing every violation. `announce`: print notes and warnings (rank 0 only).
Config setup_config(CLI::App& app, ConfigCli& cli, int argc, char** argv, int64_t world_size, Purpose purpose,
                    bool announce);
// Tokenizer vocabulary known from the flags alone (GPT-2 50257, bytes 256), 0 when unknown.
int64_t known_tokenizer_vocab(const Config& cfg);

}  // namespace mt
