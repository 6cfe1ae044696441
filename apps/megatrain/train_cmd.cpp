// train_cmd.cpp: `megatrain [train]`: flags and recipe -> validated config -> training.
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "commands.h"
#include "config/errors.h"
#include "config/yaml_io.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_liveness.h"
#include "comm/tcp_communicator.h"
#include "config_setup.h"
#include "parallel/rank_layout.h"
#include "parallel/launcher.h"
#include "tensor/device_info.h"
#include "train/capabilities.h"
#include "train/cuda_trainer.h"
#ifdef MEGATRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#endif
#include "train/trainer.h"

namespace mt {

namespace {

// A rank that fails under MPI takes the whole job down (naming itself), so no other rank waits forever.
template <typename F>
void run_aborting_on_error(const LaunchInfo& launch, F&& run) {
  try {
    run();
  } catch (const std::exception& e) {
    if (launch.world_size > 1 && mpi_active()) {
      // (one write of the whole line: the other ranks' lines do not cut into it)
      std::cerr << ("megatrain: error on rank " + std::to_string(launch.rank) + ": " + e.what() + "\n") << std::flush;
      mpi_abort_job(1);
    }
    throw;
  }
}

// The CUDA engine: one GPU per rank (the local rank picks it); more than one rank trains over NCCL, the
// unique id shared over MPI (mpirun / srun) or, for torchrun-style launches, over the TCP world
// (comm/tcp_communicator.h), which also carries the checkpoints' host collectives there.
int run_cuda_training(const Config& cfg, const LaunchInfo& launch, int& argc, char**& argv) {
  ProcessGroups groups = ProcessGroups::single();
  if (launch.world_size > 1) {
#ifdef MEGATRAIN_HAVE_NCCL
    const bool lead = launch.rank == 0;
    const int ngpu = static_cast<int>(visible_gpus().size());
    set_cuda_device(static_cast<int>(launch.local_rank % ngpu));
    const int64_t timeout = cfg.parallel.distributed_timeout_seconds;
    const RankLayout layout = RankLayout::from_config(cfg, launch.world_size);
    // --deterministic-mode: NCCL's ring algorithm unless NCCL_ALGO names another fixed-order one (validation refused the
    // rest), read by NCCL when the world communicator starts below (Megatron's apply_determinism_env)
    if (cfg.training.deterministic_mode) setenv("NCCL_ALGO", "Ring", 0);
    if (launch.kind != LauncherKind::kTorchrun) {
      mpi_initialize(&argc, &argv);
      groups = make_nccl_process_groups(make_nccl_world(launch, timeout), layout, launch.rank);
      groups.checkpoint = make_mpi_process_groups(layout, launch.rank).checkpoint;
      start_liveness_responder([] { return nccl_wait_description(); });  // names a stopped rank at a timeout
    } else {
      // Training never uses the TCP world here: it carries the unique id, then the checkpoints' collectives
      // (whose waits are long by nature: no timeout).
      auto tcp = make_tcp_world(launch, rendezvous_port(launch), timeout, 0);
      groups = make_nccl_process_groups(make_nccl_world(launch, timeout, tcp.get()), layout, launch.rank);
      groups.checkpoint = tcp;
    }
    if (lead) {
      std::ostringstream line;
      line << "megatrain: " << launch.world_size << " ranks (" << launcher_name(launch.kind) << "), one GPU each: DP "
           << cfg.derived.data_parallel_size << ", gradients averaged over NCCL" << (cfg.training.overlap_grad_reduce ? " during the backward" : "") << "\n";
      std::cerr << line.str() << std::flush;
    }
#else
    (void)argc;
    (void)argv;
    throw ConfigError("this build has no NCCL: multi-rank CUDA training is not available");
#endif
  }
  run_aborting_on_error(launch, [&] { train_cuda(cfg, groups, TrainOptions{false, launch.rank}); });
  groups = ProcessGroups::single();
  mpi_finalize();
  return 0;
}

}  // namespace

int run_train(int argc, char** argv) {
  CLI::App app{"megatrain: train a GPT / LLaMA / Mixtral-style model with Megatron-LM's flags.\n"
               "Other commands: megatrain plan (layout, memory and time without a GPU), megatrain preprocess\n"
               "(corpus -> .bin/.idx), megatrain checkpoint inspect DIR; each takes --help.\n"
               "Several ranks: mpirun -np N megatrain ..., srun megatrain ..., or torchrun --nproc_per_node N --no_python\n"
               "megatrain ... (no MPI: the ranks connect over TCP at MASTER_ADDR:MASTER_PORT, +1 under torchrun's static\n"
               "rendezvous; MEGATRAIN_RENDEZVOUS_PORT overrides).",
               "megatrain"};
  ConfigCli cli(app);
  const LaunchInfo launch = detect_launch();
  const bool lead = launch.rank == 0;
  Config cfg = setup_config(app, cli, argc, argv, launch.world_size, Purpose::kTrain, lead);
  if (cli.print_config()) {
    if (lead) std::cout << config_to_yaml(cfg);
    return 0;
  }
  // Engine: CUDA when this build has it, a GPU is visible and the configuration is one it runs;
  // --device cuda insists (and says why not), --device cpu never uses it.
  const auto gpus = visible_gpus();
  std::vector<std::string> cuda_gaps;
  std::string no_cuda_reason;
  if (!built_with_cuda()) {
    no_cuda_reason = "this build has no CUDA backend (nvcc or cuDNN 9 was missing at configure time)";
  } else if (gpus.empty()) {
    no_cuda_reason = gpu_unavailable_reason();
  } else {
    cuda_gaps = cuda_engine_gaps(cfg, launch.world_size);
  }
  const bool use_cuda = cfg.logging.device != "cpu" && no_cuda_reason.empty() && cuda_gaps.empty();
  if (cfg.logging.device == "cuda" && !use_cuda) {
    if (!no_cuda_reason.empty()) throw ConfigError("--device cuda: " + no_cuda_reason + "; use --device cpu");
    throw ConfigErrors(cuda_gaps);
  }
  const auto missing = unsupported_features(cfg, launch.world_size, use_cuda);
  if (!missing.empty()) throw ConfigErrors(missing);
  if (lead) {
    for (const auto& n : inert_flag_notes(cfg, use_cuda)) std::cerr << "megatrain: " << n << "\n";
  }
  if (cfg.derived.vocab_size == 0) {
    throw ConfigError("the vocabulary size is unknown: give --vocab-size (with --mock-data / NullTokenizer) or "
                      "--tokenizer-type ByteTokenizer (with --text-data-path)");
  }
  if (lead && !use_cuda && cfg.logging.device == "auto") {
    std::cerr << "megatrain: note: training on the CPU reference engine: ";
    if (!no_cuda_reason.empty()) {
      std::cerr << no_cuda_reason << "\n";
    } else {
      std::cerr << gpus.front().name << " is visible, but the CUDA engine does not run this configuration:";
      for (const auto& g : cuda_gaps) std::cerr << "\n  - " << g;
      std::cerr << "\n";
    }
  }
  if (use_cuda) return run_cuda_training(cfg, launch, argc, argv);
  ProcessGroups groups = ProcessGroups::single();
  if (launch.world_size > 1) {
    const RankLayout layout = RankLayout::from_config(cfg, launch.world_size);
    if (launch.kind == LauncherKind::kTorchrun) {
      // No MPI: the collectives go over TCP, each wait bounded by --distributed-timeout-seconds.
      groups = make_tcp_process_groups(make_tcp_world(launch, rendezvous_port(launch), cfg.parallel.distributed_timeout_seconds), layout,
                                       launch.rank);
    } else {
      mpi_initialize(&argc, &argv);
      groups = make_mpi_process_groups(layout, launch.rank);
      start_collective_watchdog(cfg.parallel.distributed_timeout_seconds, launch.rank);
    }
    if (lead) {
      std::ostringstream line;  // (one write: another rank's error line does not cut into it)
      line << "megatrain: " << launch.world_size << " ranks (" << launcher_name(launch.kind) << "): TP " << cfg.parallel.tensor_model_parallel_size
           << " x DP " << cfg.derived.data_parallel_size << ", collectives over " << (mpi_active() ? "MPI" : "TCP") << "\n";
      std::cerr << line.str() << std::flush;
    }
  }
  run_aborting_on_error(launch, [&] { train(cfg, groups, TrainOptions{false, launch.rank}); });
  groups = ProcessGroups::single();  // free the MPI communicators before finalising
  mpi_finalize();
  return 0;
}

}  // namespace mt
