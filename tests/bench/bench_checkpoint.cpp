// bench_checkpoint.cpp: save and load time of a model's full training state (bf16 weights, fp32 master
// weights and Adam moments) through megatrain's checkpoint code, on one rank. No training step runs:
// the state is the initialised model and a zero-moment optimizer, which has the same size and layout.
// Usage: bench_checkpoint RECIPE.yaml DIR
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "config/resolve.h"
#include "config/yaml_io.h"
#include "model/gpt_model.h"

using namespace mt;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_checkpoint RECIPE.yaml DIR\n");
    return 2;
  }
  Config cfg;
  apply_yaml_file(cfg, argv[1]);
  resolve(cfg, 1);
  auto t0 = Clock::now();
  GPTModel model(cfg, ProcessGroups::single());
  Optimizer opt(cfg, model.params(), ProcessGroups::single());
  LossScaler scaler(cfg);
  const double init_s = std::chrono::duration<double>(Clock::now() - t0).count();
  TrainState st;
  st.iteration = 1;
  const std::string dir = argv[2];
  std::filesystem::remove_all(dir);
  auto comm = std::make_shared<SelfCommunicator>();
  t0 = Clock::now();
  auto snap = take_snapshot(cfg, model.params(), opt, st, CheckpointRank{}, true);
  const double snap_s = std::chrono::duration<double>(Clock::now() - t0).count();
  size_t bytes = 0;
  for (const auto& p : snap->pieces) bytes += p.data.size() * sizeof(float);
  t0 = Clock::now();
  write_checkpoint(dir, *snap, *comm);
  const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
  snap.reset();
  t0 = Clock::now();
  LoadOptions lo;
  load_checkpoint(dir, lo, model.params(), opt, scaler);
  const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("model %lld parameters; state %.2f GB (param, master, exp_avg, exp_avg_sq in fp32)\n",
              static_cast<long long>(model.params().numel()), gb);
  std::printf("init %.1f s | snapshot (device-to-host copy on GPU; memcpy here) %.2f s = %.2f GB/s | write+fsync+commit %.2f s = %.2f GB/s | "
              "load (read, verify, reshard-capable assembly) %.2f s = %.2f GB/s\n",
              init_s, snap_s, gb / snap_s, write_s, gb / write_s, load_s, gb / load_s);
  std::filesystem::remove_all(dir);
  return 0;
}
