// checkpoint.cpp: sharded save with atomic commit (snapshots, the writer thread, rotation); the load side is
// checkpoint_load.cpp.
#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <functional>
#include <mutex>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint_files.h"
#include "checkpoint/metadata_check.h"
#include "checkpoint/schedule_on_load.h"
#include "config/errors.h"
#include "config/model_identity.h"
#include "config/yaml_io.h"
#include "model/fp8_scaling.h"

namespace mt {
namespace fs = std::filesystem;
using nlohmann::json;

using namespace checkpoint_files;


std::unique_ptr<Snapshot> take_snapshot(const Config& cfg, const ParamStore& params, Optimizer& opt, const TrainState& state,
                                        const CheckpointRank& who, bool with_optimizer) {
  auto s = std::make_unique<Snapshot>();
  s->who = who;
  s->state = state;
  s->optimizer_step = opt.iterations();
  s->optimizer_kind = cfg.training.optimizer;
  s->has_optimizer = with_optimizer;
  s->has_master = opt.master() != nullptr;
  s->config_yaml = config_to_yaml(cfg);
  s->lr_schedule_json = lr_schedule_to_json(cfg);
  s->vocab_size = cfg.derived.vocab_size;
  s->layout_json = json{{"world_size", who.world_size},
                         {"tensor_model_parallel_size", cfg.parallel.tensor_model_parallel_size},
                         {"pipeline_model_parallel_size", cfg.parallel.pipeline_model_parallel_size},
                         {"data_parallel_size", cfg.derived.data_parallel_size},
                         {"expert_model_parallel_size", cfg.parallel.expert_model_parallel_size},
                         {"expert_tensor_parallel_size", cfg.derived.expert_tensor_parallel_size},
                         {"use_distributed_optimizer", cfg.training.use_distributed_optimizer}}.dump();
  std::vector<const float*> sources;
  auto add = [&](size_t i, const char* kind, int64_t lo, int64_t hi, const float* src) {
    const ParamInfo& p = params.info(i);
    s->pieces.push_back({p.name, kind, p.global_shape, p.local_shape, p.shard_dim, p.shard_rank, p.shard_count, lo, hi, {}});
    sources.push_back(src);
  };
  // A replicated shard (K/V replication) is written by its first holder only; the last pipeline stage's copy of
  // the tied embedding not at all (the first stage writes the embedding; a load fills the copy from it).
  auto written = [&](size_t i) { return params.info(i).replica == 0 && !params.info(i).tied_copy; };
  auto expert = [&](size_t i) { return params.info(i).grad_group == GradGroup::kExpert; };
  for (size_t i = 0; i < params.size(); ++i) {
    if (written(i) && (expert(i) ? who.writes_expert_params : who.writes_params)) add(i, "param", 0, params.info(i).numel, params.param(i));
  }
  if (with_optimizer) {
    for (const auto& seg : opt.segments()) {
      if (!written(seg.param) || !(expert(seg.param) ? who.writes_expert_optimizer : who.writes_optimizer)) continue;
      const int64_t off = params.info(seg.param).offset;
      const int64_t lo = seg.begin - off, hi = seg.end - off;
      if (opt.master()) add(seg.param, "master", lo, hi, opt.master() + seg.state);
      add(seg.param, "exp_avg", lo, hi, opt.exp_avg() + seg.state);
      if (opt.exp_avg_sq()) add(seg.param, "exp_avg_sq", lo, hi, opt.exp_avg_sq() + seg.state);
    }
  }
  parallel_for(s->pieces.size(), [&](size_t k) {
    auto& pc = s->pieces[k];
    pc.data.assign(sources[k], sources[k] + (pc.hi - pc.lo));
  });
  return s;
}

std::string checkpoint_path(const std::string& dir, int64_t it) { return (fs::path(dir) / iter_name(it)).string(); }

std::optional<int64_t> latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw DataError("'" + dir + "' is a file, not a checkpoint directory: give --load the directory that --save wrote");
  }
  const fs::path tracker = fs::path(dir) / "latest_checkpointed_iteration.txt";
  std::ifstream in(tracker);
  if (!in) {
    // No tracker: a directory of committed iterations (a tracker lost or deleted) must not start from scratch.
    std::vector<int64_t> its;
    if (fs::is_directory(dir, ec)) {
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() >= 12 && n.rfind("iter_", 0) == 0 && n.find_first_not_of("0123456789", 5) == std::string::npos &&
            fs::exists(e.path() / "metadata.json", ec)) {
          its.push_back(std::stoll(n.substr(5)));
        }
      }
    }
    if (its.empty()) return std::nullopt;
    std::sort(its.begin(), its.end());
    std::string list;
    for (size_t i = 0; i < its.size() && i < 8; ++i) list += (list.empty() ? "" : ", ") + std::to_string(its[i]);
    if (its.size() > 8) list += ", ...";
    throw DataError(dir + " holds committed iterations (" + list + ") but no " + tracker.filename().string() +
                    ": resume one of them with --ckpt-step " + std::to_string(its.back()) + ", or give another --load");
  }
  std::string text;
  in >> text;
  char* end = nullptr;
  const long long it = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || it < 0) throw DataError(tracker.string() + " does not hold an iteration number ('" + text + "')");
  return it;
}

namespace {

// An old checkpoint deleted (--save-retain-interval, --ckpt-keep-last): first renamed out of the iter_N names, so that a
// deletion cut short leaves no iter_N with shards missing for --ckpt-step to find, then removed; a leftover of an earlier
// cut-short deletion goes with it.
void remove_old_checkpoint(const std::string& dir, int64_t iteration) {
  const fs::path from = fs::path(dir) / iter_name(iteration), doomed = fs::path(dir) / (iter_name(iteration) + ".deleting");
  std::error_code ec;
  fs::remove_all(doomed, ec);
  fs::rename(from, doomed, ec);
  std::error_code removed;
  fs::remove_all(ec ? from : doomed, removed);
}

void write_checkpoint_files(const std::string& dir, const Snapshot& snap, Communicator& comm, const CheckpointRetention& retention) {
  const int64_t it = snap.state.iteration;
  const fs::path final_dir = fs::path(dir) / iter_name(it);
  const fs::path tmp_dir = fs::path(dir) / (iter_name(it) + ".tmp");
  const bool lead = snap.who.world_rank == 0;
  int64_t previous = 0;  // (--save-retain-interval: the iteration the tracker named before this save)
  if (lead) {
    fs::create_directories(dir);
    fs::remove_all(tmp_dir);  // a save killed earlier
    fs::create_directories(tmp_dir);
  }
  comm.barrier();
  // This rank's shard file and its pieces' metadata.
  char fname[32];
  std::snprintf(fname, sizeof(fname), "rank_%05lld.bin", static_cast<long long>(snap.who.world_rank));
  // The model's pieces, then FP8's scaling state (model/fp8_scaling.h) where the snapshot has it.
  std::vector<const Snapshot::Piece*> all_pieces;
  for (const auto& pc : snap.pieces) all_pieces.push_back(&pc);
  for (const auto& pc : snap.fp8_scaling) all_pieces.push_back(&pc);
  std::vector<uint64_t> sums(all_pieces.size());
  parallel_for(all_pieces.size(), [&](size_t k) { sums[k] = checksum64(all_pieces[k]->data.data(), all_pieces[k]->data.size() * sizeof(float)); });
  json pieces = json::array();
  std::FILE* f = std::fopen((tmp_dir / fname).c_str(), "wb");
  if (!f) throw DataError("cannot write " + (tmp_dir / fname).string() + ": " + std::strerror(errno));
  size_t offset = 0;
  bool ok = true;
  for (size_t k = 0; k < all_pieces.size(); ++k) {
    const auto& pc = *all_pieces[k];
    const size_t n = pc.data.size() * sizeof(float);
    pieces.push_back({{"tensor", pc.name}, {"kind", pc.kind}, {"file", fname}, {"offset", offset}, {"bytes", n},
                      {"global_shape", pc.global_shape}, {"local_shape", pc.local_shape}, {"shard_dim", pc.shard_dim},
                      {"shard_rank", pc.shard_rank}, {"shard_count", pc.shard_count}, {"range", {pc.lo, pc.hi}},
                      {"dtype", "fp32"}, {"checksum", hex(sums[k])}});
    ok = ok && (n == 0 || std::fwrite(pc.data.data(), 1, n, f) == n);
    offset += n;
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  ok = std::fclose(f) == 0 && ok;
  // Every rank learns whether every rank wrote its shard: a failure anywhere fails the save everywhere
  // (nobody waits forever), and the previous checkpoint stays the committed one.
  const std::string report = ok ? pieces.dump() : std::string("!") + (tmp_dir / fname).string();
  const auto all = comm.all_gather_strings(report);
  for (const auto& r : all) {
    if (!r.empty() && r[0] == '!') throw DataError("writing checkpoint shard " + r.substr(1) + " failed (disk full?); the last committed checkpoint is unchanged");
  }
  if (lead) {
    // Every shard must be visible here (a non-shared filesystem would commit metadata naming files
    // rank 0 cannot see).
    for (size_t r = 0; r < all.size(); ++r) {
      const auto list = json::parse(all[r]);
      int64_t expect = 0;
      for (const auto& pc : list) expect += pc["bytes"].get<int64_t>();
      char rn[32];
      std::snprintf(rn, sizeof(rn), "rank_%05zu.bin", r);
      std::error_code ec;
      const auto size = fs::file_size(tmp_dir / rn, ec);
      if (ec || static_cast<int64_t>(size) != expect) {
        throw DataError("checkpoint shard " + (tmp_dir / rn).string() + " is not visible to rank 0 with " + std::to_string(expect) +
                        " bytes: --save must be on a filesystem every rank shares");
      }
    }
    json tensors = json::object(), fp8_scaling = json::object();
    for (const auto& s : all) {
      for (const auto& pc : json::parse(s)) {
        auto& t = (pc["kind"] == "fp8_scaling" ? fp8_scaling : tensors)[pc["tensor"].get<std::string>()];
        t["global_shape"] = pc["global_shape"];
        t["dtype"] = "fp32";
        t["shards"].push_back(pc);
      }
    }
    const TrainState& st = snap.state;
    json meta = {{"format", "megatrain-checkpoint"},
                 {"version", 1},
                 {"iteration", it},
                 {"vocab_size", snap.vocab_size},
                 {"consumed_samples", st.consumed_samples},
                 {"lr_schedule_start_samples", st.lr_schedule_start_samples},
                 {"flops_so_far", st.flops_so_far},
                 {"skipped_iterations", st.skipped},
                 {"nan_iterations", st.nan_iterations},
                 {"loss_scaler", {{"scale", st.scaler.scale}, {"hysteresis_left", st.scaler.hysteresis_left}, {"clean_steps", st.scaler.clean_steps},
                                  {"dynamic", st.scaler.dynamic}}},
                 {"optimizer", {{"saved", snap.has_optimizer}, {"kind", snap.optimizer_kind}, {"step", snap.optimizer_step},
                                {"master_weights", snap.has_master}}},
                 {"rng", "counter-based: every random number is a function of (seed, iteration, sample); no state to save"},
                 {"layout", json::parse(snap.layout_json)},
                 {"config", snap.config_yaml},
                 {"lr_schedule", json::parse(snap.lr_schedule_json)},
                 {"tensors", tensors}};
    if (!fp8_scaling.empty()) meta["fp8_scaling"] = fp8_scaling;
    const std::string text = meta.dump(1);
    write_file_synced(tmp_dir / "metadata.json", text.data(), text.size());
    // Its own checksum beside it: an edited or damaged metadata.json is refused before anything reads it.
    const std::string sum = hex(checksum64(text.data(), text.size())) + "\n";
    write_file_synced(tmp_dir / "metadata.json.checksum", sum.data(), sum.size());
  }
  comm.barrier();  // every shard is on disk (each rank fsynced its own)
  if (lead) {
    fsync_path(tmp_dir, true);
    if (fs::exists(final_dir)) {
      const fs::path old = fs::path(dir) / (iter_name(it) + ".old");
      fs::remove_all(old);
      fs::rename(final_dir, old);
      fs::rename(tmp_dir, final_dir);
      fs::remove_all(old);
    } else {
      fs::rename(tmp_dir, final_dir);
    }
    fsync_path(dir, true);
    // (--save-retain-interval: the tracker's iteration before this save's, Megatron's prev_iteration; an unreadable tracker
    // deletes nothing)
    if (retention.retain_interval > 0) {
      try {
        previous = latest_checkpoint(dir).value_or(0);
      } catch (const std::exception&) {
        previous = 0;
      }
    }
    const std::string num = std::to_string(it);
    const fs::path tracker_tmp = fs::path(dir) / "latest_checkpointed_iteration.txt.tmp";
    write_file_synced(tracker_tmp, num.data(), num.size());
    fs::rename(tracker_tmp, fs::path(dir) / "latest_checkpointed_iteration.txt");
    fsync_path(dir, true);
  }
  comm.barrier();
  if (lead && retention.retain_interval > 0 && previous > 0 && previous != it && previous % retention.retain_interval != 0) {
    // Megatron's: the checkpoint before is deleted unless its iteration is a multiple of the interval (not through a
    // symbolic link), after this one is committed.
    std::error_code ec;
    if (!fs::is_symlink(fs::path(dir) / iter_name(previous), ec)) remove_old_checkpoint(dir, previous);
  }
  const int64_t keep_last = retention.keep_last;
  if (lead && keep_last > 0) {
    // Old checkpoints go only after the new one is committed, and nobody waits for the deletion.
    std::vector<int64_t> its;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.size() >= 12 && n.rfind("iter_", 0) == 0 && e.is_directory() &&
          n.find_first_not_of("0123456789", 5) == std::string::npos) {
        its.push_back(std::stoll(n.substr(5)));
      }
    }
    std::sort(its.begin(), its.end());
    for (size_t k = 0; k + static_cast<size_t>(keep_last) < its.size(); ++k) {
      if (its[k] != it) remove_old_checkpoint(dir, its[k]);
    }
  }
}

}  // namespace

void write_checkpoint(const std::string& dir, const Snapshot& snap, Communicator& comm, const CheckpointRetention& retention) {
  try {
    write_checkpoint_files(dir, snap, comm, retention);
  } catch (...) {
    // A failed save (a full disk, a lost directory) leaves no partial iteration behind; the committed ones and
    // the tracker are untouched until the commit's renames.
    std::error_code ec;
    fs::remove_all(fs::path(dir) / (iter_name(snap.state.iteration) + ".tmp"), ec);
    throw;
  }
}

CheckpointSaver::CheckpointSaver(std::string dir, bool async, CheckpointRetention retention, std::shared_ptr<Communicator> comm)
    : dir_(std::move(dir)), async_(async), retention_(retention), comm_(std::move(comm)), lock_(dir_, *comm_) {}

CheckpointSaver::~CheckpointSaver() {
  if (worker_.joinable()) worker_.join();
}

void CheckpointSaver::wait() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointSaver::save(std::unique_ptr<Snapshot> snap) {
  wait();
  if (!async_) {
    write_checkpoint(dir_, *snap, *comm_, retention_);
    return;
  }
  worker_ = std::thread([this, s = std::shared_ptr<Snapshot>(std::move(snap))] {
    try {
      write_checkpoint(dir_, *s, *comm_, retention_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

std::string fp8_scaling_piece(int64_t layer, bool experts) {
  return "decoder.layers." + std::to_string(layer) + (experts ? ".mlp.experts.fp8_scaling" : ".fp8_scaling");
}

void add_fp8_scaling(Snapshot& snap, const std::map<int64_t, std::vector<float>>& layers, int64_t history_len) {
  const auto site_size = static_cast<size_t>(3 * (1 + history_len));
  for (const auto& [layer, data] : layers) {
    // The layer's four sites; an MoE layer's experts' sites after them as a tensor of their own, [2 E, 3, 1 + len]
    // (expert e's fc1 then fc2), by global expert.
    const size_t dense = kFp8Sites * site_size;
    const std::vector<int64_t> shape{kFp8Sites, 3, 1 + history_len};
    snap.fp8_scaling.push_back({fp8_scaling_piece(layer, false), "fp8_scaling", shape, shape, -1, 0, 1, 0,
                                static_cast<int64_t>(dense), std::vector<float>(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(dense))});
    if (data.size() > dense) {
      const std::vector<int64_t> experts{static_cast<int64_t>((data.size() - dense) / site_size), 3, 1 + history_len};
      snap.fp8_scaling.push_back({fp8_scaling_piece(layer, true), "fp8_scaling", experts, experts, -1, 0, 1,
                                  0, static_cast<int64_t>(data.size() - dense),
                                  std::vector<float>(data.begin() + static_cast<std::ptrdiff_t>(dense), data.end())});
    }
  }
}

}  // namespace mt
