// main.cpp: megatrain's entry point. Dispatches subcommands and turns errors into one clear line
// and a non-zero exit.
#include <cstring>
#include <chrono>
#include <iostream>
#include <new>
#include <thread>
#include <string>

#include "commands.h"
#include "config/errors.h"
#include "parallel/launcher.h"

namespace {

void print_usage() {
  std::cout << "megatrain: Megatron-class LLM pretraining (C++/CUDA)\n\n"
               "Usage:\n"
               "  megatrain [train] [flags]       train (Megatron-LM flags, or --config recipe.yaml)\n"
               "  megatrain plan --world-size N   check a layout and estimate memory and time, no GPU needed\n"
               "  megatrain preprocess ...        tokenize a corpus into Megatron's .bin/.idx\n"
               "  megatrain checkpoint inspect DIR  iteration, layout, tensors of a checkpoint (--verify: checksums)\n"
               "  megatrain checkpoint export DIR --hf OUT   a checkpoint (any layout) as a HuggingFace model\n"
               "  megatrain checkpoint import --hf DIR --save CKPT   a HuggingFace model as a checkpoint\n"
               "  megatrain report DIR... [-o FILE]   the runs' metrics as one HTML page (inline SVG)\n\n"
               "  megatrain train --help          every flag, grouped like Megatron's arguments\n"
               "  megatrain plan --help           planner options\n";
}

bool is_lead_rank() {
  try {
    return mt::detect_launch().rank == 0;
  } catch (...) {
    return true;
  }
}

// Every rank finds the same configuration errors and rank 0 reports them. The other ranks wait a moment
// before exiting: mpirun tears the job down at the first non-zero exit, which could otherwise cut rank 0
// off before its message is out.
int config_error_exit() {
  if (!is_lead_rank()) std::this_thread::sleep_for(std::chrono::seconds(2));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string sub = argc > 1 ? argv[1] : "";
    if (sub == "plan") return mt::run_plan(argc - 1, argv + 1);
    if (sub == "train") return mt::run_train(argc - 1, argv + 1);
    if (sub == "preprocess") return mt::run_preprocess(argc - 1, argv + 1);
    if (sub == "checkpoint") return mt::run_checkpoint(argc - 1, argv + 1);
    if (sub == "report") return mt::run_report(argc - 1, argv + 1);
    if (sub == "help" || (argc == 2 && (sub == "-h" || sub == "--usage"))) {
      print_usage();
      return 0;
    }
    if (sub == "--version") {
      std::cout << "megatrain 0.1.0\n";
      return 0;
    }
    return mt::run_train(argc, argv);
  } catch (const mt::ConfigErrors& e) {
    // Every rank finds the same configuration errors: rank 0 says them.
    if (is_lead_rank()) {
      for (const auto& m : e.messages) std::cerr << ("megatrain: error: " + m + "\n") << std::flush;
    }
    return config_error_exit();
  } catch (const mt::ConfigError& e) {
    if (is_lead_rank()) std::cerr << ("megatrain: error: " + std::string(e.what()) + "\n") << std::flush;
    return config_error_exit();
  } catch (const mt::DataError& e) {
    std::cerr << ("megatrain: error: " + std::string(e.what()) + "\n");  // (one write: ranks' lines do not interleave)
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << "megatrain: error: out of host memory: the model, batch or data is too large for this machine; `megatrain plan` shows the memory "
                 "per rank (use more ranks, a smaller --micro-batch-size, or the CUDA engine)\n";
    return 2;
  } catch (const std::exception& e) {
    const std::string m = e.what();
    if (m.rfind("[json.exception.", 0) == 0) {  // a JSON file of the wrong shape, caught nowhere nearer
      std::cerr << "megatrain: error: a JSON input (tokenizer, dataset or checkpoint file) is malformed: " << mt::json_error_text(e) << "\n";
      return 2;
    }
    std::cerr << "megatrain: error: " << m << "\n";
    return 1;
  }
}
