// checkpoint.h: distributed checkpoints. DIR/iter_XXXXXXX/ holds one shard file per rank, written in
// parallel, and metadata.json describing every tensor (global shape, each shard's slice, byte range,
// checksum). A checkpoint is whole or absent: ranks write into iter_XXXXXXX.tmp, rank 0 renames it
// after everyone finished and synced, then updates latest_checkpointed_iteration.txt the same way.
// Loading reassembles each tensor from whatever layout saved it (TP, DP, distributed optimizer) and
// cuts this rank's slice, so a checkpoint loads under any layout the shapes allow.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/save_lock.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"

namespace mt {

struct TrainState {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  double flops_so_far = 0;
  int64_t skipped = 0, nan_iterations = 0;
  LossScaler::State scaler{1.0f, 0, 0};
  // The samples consumed when the learning-rate schedule started: 0, or the dense run's after --moe-use-upcycling
  // (Megatron's upcycled run keeps the data position and starts a fresh schedule). The rate is the schedule's at
  // consumed - lr_schedule_start_samples.
  int64_t lr_schedule_start_samples = 0;
};

struct CheckpointRank {
  int64_t world_rank = 0, world_size = 1;
  bool writes_params = true;  // one data-parallel replica writes the parameters
  bool writes_optimizer = true;
  // The expert parameters (MoE): one expert-data-parallel replica writes them (the dense writer may hold other
  // experts or none), and their optimizer state.
  bool writes_expert_params = true;
  bool writes_expert_optimizer = true;
};

// A copy of everything one rank writes (so an async save can run while training changes the state).
struct Snapshot {
  struct Piece {
    std::string name, kind;  // kind: param | master | exp_avg | exp_avg_sq
    std::vector<int64_t> global_shape, local_shape;
    int shard_dim;
    int64_t shard_rank, shard_count, lo, hi;  // element range of the local shard
    std::vector<float> data;
  };
  std::vector<Piece> pieces;
  CheckpointRank who;
  TrainState state;
  int64_t optimizer_step = 0;
  std::string optimizer_kind;
  bool has_optimizer = false, has_master = false;
  std::string config_yaml, layout_json, lr_schedule_json;
  int64_t vocab_size = 0;
  // FP8's delayed-scaling state (model/fp8_scaling.h), one piece per FP8 layer ("decoder.layers.N.fp8_scaling",
  // [4 sites, 3 tensors, 1 + history length]: the scale, then the amax history) and for an MoE layer one more for its
  // experts' sites ("decoder.layers.N.mlp.experts.fp8_scaling", [2 x experts, 3, 1 + history length]), written by one
  // rank per pipeline stage; metadata.json lists them under "fp8_scaling", apart from the model's tensors.
  std::vector<Piece> fp8_scaling;
};

// Adds `layers` (global layer -> its Fp8ScalingState::layer_state) to the snapshot.
// The names of a layer's delayed-scaling pieces: its four sites', or (experts) its MoE experts' sites'.
std::string fp8_scaling_piece(int64_t layer, bool experts);
void add_fp8_scaling(Snapshot& snap, const std::map<int64_t, std::vector<float>>& layers, int64_t history_len);
// The saved FP8 scaling state of each of `layers` found in the checkpoint (empty: none saved) and the saved history
// length in *history_len.
std::map<int64_t, std::vector<float>> load_fp8_scaling(const std::string& dir, std::optional<int64_t> step, const std::vector<int64_t>& layers,
                                                       int64_t* history_len);

// Copies this rank's state (parameters, optimizer state unless !with_optimizer, training state).
std::unique_ptr<Snapshot> take_snapshot(const Config& cfg, const ParamStore& params, Optimizer& opt, const TrainState& state,
                                        const CheckpointRank& who, bool with_optimizer);
// Which older checkpoints a save deletes once its own is committed: none by default; --ckpt-keep-last's newest N kept;
// Megatron's --save-retain-interval: the checkpoint before this one (the tracker's) unless its iteration is a multiple
// of the interval (so the multiples and the newest remain).
struct CheckpointRetention {
  int64_t keep_last = 0;
  int64_t retain_interval = 0;
};

// Writes and commits the snapshot under dir (collective over comm: every rank calls it).
void write_checkpoint(const std::string& dir, const Snapshot& snap, Communicator& comm, const CheckpointRetention& retention = {});

// Saves synchronously or in a background thread (--async-save); a new save first waits for the last.
class CheckpointSaver {
 public:
  CheckpointSaver(std::string dir, bool async, CheckpointRetention retention, std::shared_ptr<Communicator> comm);
  ~CheckpointSaver();
  void save(std::unique_ptr<Snapshot> snap);
  void wait();  // rethrows a background failure

 private:
  std::string dir_;
  bool async_;
  CheckpointRetention retention_;
  std::shared_ptr<Communicator> comm_;
  SaveDirectoryLock lock_;  // one run at a time per --save directory
  std::thread worker_;
  std::exception_ptr error_;
};

// The iteration of DIR's tracker file, if any (throws DataError on a corrupt tracker).
std::optional<int64_t> latest_checkpoint(const std::string& dir);
std::string checkpoint_path(const std::string& dir, int64_t iteration);

struct LoadOptions {
  std::optional<int64_t> step;  // --ckpt-step
  bool load_optimizer = true;   // !--no-load-optim && !--finetune
  bool finetune = false;        // weights only, iteration 0
  std::string optimizer_kind;   // refuse state of another optimizer ("" = no check)
  int64_t vocab_size = 0;       // refuse another tokenizer's vocabulary (0 = no check)
  int64_t model_tensors = 0;    // the whole model's tensors, when the store holds one pipeline stage (0: the store's)
  // The run's configuration: the checkpoint's architecture settings must be its (config/model_identity.h).
  const Config* run_config = nullptr;
  // --moe-use-upcycling (checkpoint/upcycle.h): the checkpoint holds the dense counterpart of run_config's MoE model,
  // loaded weights only; the state returned is iteration 0 with no FLOPs, at the dense run's data position (0 with
  // --finetune), where the learning-rate schedule starts.
  bool upcycle = false;
};

// Loads into this rank's shard; throws DataError naming the file / tensor on any problem.
TrainState load_checkpoint(const std::string& dir, const LoadOptions& opt, ParamStore& params, Optimizer& optimizer,
                           LossScaler& scaler);

// The configuration YAML stored in the checkpoint (for --use-checkpoint-args).
std::string checkpoint_config_yaml(const std::string& dir, std::optional<int64_t> step);

// What a checkpoint holds, without loading it: its directory, iteration, configuration YAML, the tokenizer's
// vocabulary size and each tensor's global shape (by name).
struct CheckpointInfo {
  std::string dir;
  int64_t iteration = 0;
  std::string config_yaml;
  int64_t vocab_size = 0;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::string lr_schedule_json;  // (the schedule it was saved with, in samples; empty in checkpoints from before it was kept)
  bool has_optimizer = false;    // (its optimizer state saved: not with --no-save-optim)
};
CheckpointInfo checkpoint_info(const std::string& dir, std::optional<int64_t> step);

// Human-readable summary; with verify, every piece's checksum is checked.
std::string inspect_checkpoint(const std::string& dir, std::optional<int64_t> step, bool verify);

}  // namespace mt
