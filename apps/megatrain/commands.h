// commands.h: the megatrain subcommands. main() picks one from argv[1] (train when none is named).
#pragma once

namespace mt {

int run_train(int argc, char** argv);
int run_plan(int argc, char** argv);
int run_preprocess(int argc, char** argv);
int run_checkpoint(int argc, char** argv);
int run_report(int argc, char** argv);

}  // namespace mt
