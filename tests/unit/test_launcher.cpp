// test_launcher.cpp: launcher detection from environment variables.
#include <map>

#include "catch.h"
#include "config/errors.h"
#include "parallel/launcher.h"

using namespace mt;

namespace {
EnvLookup env(std::map<std::string, std::string> m) {
  return [m](const std::string& k) -> std::optional<std::string> {
    auto it = m.find(k);
    if (it == m.end()) return std::nullopt;
    return it->second;
  };
}
}  // namespace

TEST_CASE("single process") {
  const LaunchInfo i = detect_launch(env({}));
  CHECK(i.kind == LauncherKind::kSingle);
  CHECK(i.world_size == 1);
  CHECK(i.rank == 0);
}

TEST_CASE("Open MPI, also inside a SLURM allocation") {
  const LaunchInfo i = detect_launch(env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "1"}}));
  CHECK(i.kind == LauncherKind::kOpenMpi);
  CHECK(i.rank == 3);
  CHECK(i.world_size == 8);
  CHECK(i.local_rank == 1);
}

TEST_CASE("SLURM srun") {
  const LaunchInfo i = detect_launch(env({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                                          {"SLURM_NTASKS_PER_NODE", "8(x2)"}}));
  CHECK(i.kind == LauncherKind::kSlurm);
  CHECK(i.rank == 9);
  CHECK(i.world_size == 16);
  CHECK(i.local_rank == 1);
  CHECK(i.local_world_size == 8);
}

TEST_CASE("torchrun-style") {
  const LaunchInfo i = detect_launch(env({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"},
                                          {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "6000"}}));
  CHECK(i.kind == LauncherKind::kTorchrun);
  CHECK(i.rank == 2);
  CHECK(i.world_size == 4);
  CHECK(i.master_addr == "node7");
  CHECK(i.master_port == 6000);
}

TEST_CASE("inconsistent launcher variables are errors") {
  CHECK_THROWS_AS(detect_launch(env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), ConfigError);
  CHECK_THROWS_AS(detect_launch(env({{"RANK", "x"}, {"WORLD_SIZE", "4"}})), ConfigError);
}
