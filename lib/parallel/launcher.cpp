// launcher.cpp: environment-variable launcher detection. torchrun's workers first (TORCHELASTIC_RUN_ID
// with RANK / WORLD_SIZE: `srun torchrun ...`, one torchrun per node, leaves SLURM's per-node variables in
// the workers' environment), then Open MPI (mpirun inside a SLURM allocation sets both), then SLURM's srun,
// then torchrun-style variables set by hand.
#include "parallel/launcher.h"

#include <algorithm>
#include <cstdlib>

#include "config/errors.h"

namespace mt {
namespace {

int64_t to_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < 0) {
    throw ConfigError("environment variable " + name + "='" + v + "' is not a non-negative integer: check the launcher");
  }
  return x;
}

}  // namespace

const char* launcher_name(LauncherKind k) {
  switch (k) {
    case LauncherKind::kSingle: return "single process";
    case LauncherKind::kOpenMpi: return "Open MPI";
    case LauncherKind::kSlurm: return "SLURM";
    case LauncherKind::kTorchrun: return "torchrun-style";
  }
  return "?";
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

LaunchInfo detect_launch(const EnvLookup& env) {
  LaunchInfo info;
  auto get = [&](const char* name, int64_t dflt) -> int64_t {
    auto v = env(name);
    return v ? to_int(name, *v) : dflt;
  };
  const bool torchrun_worker = env("TORCHELASTIC_RUN_ID") && env("RANK") && env("WORLD_SIZE");
  if (!torchrun_worker && env("OMPI_COMM_WORLD_SIZE")) {
    info.kind = LauncherKind::kOpenMpi;
    info.rank = get("OMPI_COMM_WORLD_RANK", 0);
    info.world_size = get("OMPI_COMM_WORLD_SIZE", 1);
    info.local_rank = get("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    info.local_world_size = get("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (!torchrun_worker && env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    info.kind = LauncherKind::kSlurm;
    info.rank = get("SLURM_PROCID", 0);
    info.world_size = get("SLURM_NTASKS", 1);
    info.local_rank = get("SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE may read "4(x2)": the leading count is what this node runs.
    const std::string per_node = env("SLURM_NTASKS_PER_NODE").value_or("1");
    info.local_world_size = std::max<int64_t>(1, std::strtoll(per_node.c_str(), nullptr, 10));
  } else if (env("RANK") && env("WORLD_SIZE")) {
    info.kind = LauncherKind::kTorchrun;
    info.rank = get("RANK", 0);
    info.world_size = get("WORLD_SIZE", 1);
    info.local_rank = get("LOCAL_RANK", 0);
    info.local_world_size = get("LOCAL_WORLD_SIZE", 1);
    info.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    info.master_port = static_cast<int>(get("MASTER_PORT", 29500));
  }
  if (info.world_size < 1) throw ConfigError(std::string(launcher_name(info.kind)) + " reports a world size of 0");
  // A job of more ranks than any machine room holds is a typo in the environment, not a plan.
  constexpr int64_t kMaxWorld = 1 << 20;
  if (info.world_size > kMaxWorld) {
    throw ConfigError(std::string(launcher_name(info.kind)) + " reports a world size of " + std::to_string(info.world_size) + " (more than " +
                      std::to_string(kMaxWorld) + "): check WORLD_SIZE / the launcher's environment");
  }
  if (info.kind == LauncherKind::kTorchrun && (info.master_port < 1 || info.master_port > 65535 || get("MASTER_PORT", 29500) != info.master_port)) {
    throw ConfigError("MASTER_PORT " + env("MASTER_PORT").value_or("") + " is not a TCP port (1-65535): set MASTER_PORT to a free port, e.g. 29500");
  }
  if (info.rank >= info.world_size) {
    throw ConfigError(std::string(launcher_name(info.kind)) + " reports rank " + std::to_string(info.rank) +
                      " but world size " + std::to_string(info.world_size) + ": check the launcher's environment");
  }
  return info;
}

}  // namespace mt
