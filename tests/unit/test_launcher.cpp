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

TEST_CASE("torchrun's workers under srun or mpirun: torchrun's variables win") {
  // srun torchrun --nnodes 2 --nproc_per_node 8: SLURM counts the two torchruns, torchrun the 16 workers.
  const LaunchInfo s = detect_launch(env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"RANK", "11"},
                                          {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "8"},
                                          {"TORCHELASTIC_RUN_ID", "job"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}}));
  CHECK(s.kind == LauncherKind::kTorchrun);
  CHECK(s.rank == 11);
  CHECK(s.world_size == 16);
  CHECK(s.local_rank == 3);
  CHECK(s.master_addr == "node0");
  const LaunchInfo m = detect_launch(env({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"RANK", "1"}, {"WORLD_SIZE", "2"},
                                          {"TORCHELASTIC_RUN_ID", "none"}}));
  CHECK(m.kind == LauncherKind::kTorchrun);
  CHECK(m.rank == 1);
  // RANK / WORLD_SIZE exported by a job script under srun, without torchrun: srun's variables count.
  const LaunchInfo j = detect_launch(env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"RANK", "5"}, {"WORLD_SIZE", "9"}}));
  CHECK(j.kind == LauncherKind::kSlurm);
  CHECK(j.rank == 1);
}

TEST_CASE("inconsistent launcher variables are errors") {
  CHECK_THROWS_AS(detect_launch(env({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), ConfigError);
  CHECK_THROWS_AS(detect_launch(env({{"RANK", "x"}, {"WORLD_SIZE", "4"}})), ConfigError);
}
