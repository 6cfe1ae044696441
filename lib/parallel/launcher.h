// launcher.h: who started us. Detects single process, Open MPI (mpirun), SLURM (srun) and
// torchrun-style environments, and reports rank, world size and local rank.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace mt {

enum class LauncherKind { kSingle, kOpenMpi, kSlurm, kTorchrun };

struct LaunchInfo {
  LauncherKind kind = LauncherKind::kSingle;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string master_addr;  // torchrun-style rendezvous
  int master_port = 0;
};

const char* launcher_name(LauncherKind k);

// getenv-like lookup, injectable for tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Throws ConfigError on inconsistent variables (rank >= world size, non-numbers).
LaunchInfo detect_launch(const EnvLookup& env = process_env());

}  // namespace mt
