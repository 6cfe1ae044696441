// checkpoint_load.cpp: a checkpoint opened and checked, each rank's shards assembled from the saved pieces that
// overlap them (resharding across TP, PP, EP and DP changes), the FP8 scaling state, and inspection.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_files.h"
#include "checkpoint/metadata_check.h"
#include "checkpoint/upcycle.h"
#include "config/errors.h"
#include "config/model_identity.h"
#include "config/yaml_io.h"
#include "model/fp8_scaling.h"

namespace mt {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace checkpoint_files;

namespace {

struct Opened {
  fs::path dir;
  json meta;
  int64_t iteration = 0;
};

Opened open_checkpoint(const std::string& dir, std::optional<int64_t> step) {
  Opened o;
  std::optional<int64_t> it = step;
  if (!it) it = latest_checkpoint(dir);
  if (!it) {
    throw DataError("no checkpoint in " + dir + " (no latest_checkpointed_iteration.txt): check --load, or start without it");
  }
  o.iteration = *it;
  o.dir = fs::path(dir) / iter_name(*it);
  // A re-save of the same iteration killed between its two renames leaves the committed copy as .old.
  if (!fs::exists(o.dir) && fs::exists(fs::path(dir) / (iter_name(*it) + ".old"))) o.dir = fs::path(dir) / (iter_name(*it) + ".old");
  const fs::path mp = o.dir / "metadata.json";
  std::ifstream in(mp);
  if (!in) {
    throw DataError("checkpoint " + o.dir.string() + " is missing or incomplete (no metadata.json)" +
                    (step ? std::string(": check --ckpt-step") : std::string("")));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ifstream sum_in(o.dir / "metadata.json.checksum");
  std::string sum;
  if (sum_in >> sum && sum != hex(checksum64(text.data(), text.size()))) {  // (checkpoints before it have none)
    throw DataError(mp.string() + " does not match the checksum written with it: the file was edited or damaged after the save");
  }
  try {
    o.meta = json::parse(text);
  } catch (const json::exception& e) {
    throw DataError(mp.string() + " is corrupt: " + json_error_text(e));
  }
  if (!o.meta.is_object() || o.meta.value("format", "") != "megatrain-checkpoint") throw DataError(mp.string() + " is not a megatrain checkpoint");
  check_checkpoint_metadata(o.meta, mp, o.iteration);
  return o;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Reads one piece, checking its checksum.
std::vector<float> read_piece(const fs::path& dir, const json& pc) {
  const fs::path file = dir / pc["file"].get<std::string>();
  const auto offset = pc["offset"].get<int64_t>(), bytes = pc["bytes"].get<int64_t>();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("checkpoint shard " + file.string() + " is missing");
  std::vector<float> data(static_cast<size_t>(bytes) / sizeof(float));
  in.seekg(offset);
  if (!in.read(reinterpret_cast<char*>(data.data()), bytes)) {
    throw DataError("checkpoint shard " + file.string() + " is truncated (bytes " + std::to_string(offset) + ".." +
                    std::to_string(offset + bytes) + " missing)");
  }
  if (hex(checksum64(data.data(), static_cast<size_t>(bytes))) != pc["checksum"].get<std::string>()) {
    throw DataError("checksum mismatch in " + file.string() + " (" + pc["tensor"].get<std::string>() + ", bytes " +
                    std::to_string(offset) + ".." + std::to_string(offset + bytes) + "): the checkpoint is corrupt");
  }
  return data;
}

// Global element index of local element e of a shard (row-major, split along shard_dim).
int64_t to_global(const std::vector<int64_t>& local, const std::vector<int64_t>& global, int dim, int64_t rank, int64_t e) {
  if (dim < 0) return e;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < local.size(); ++d) inner *= local[d];
  const int64_t dl = local[static_cast<size_t>(dim)], dg = global[static_cast<size_t>(dim)];
  return ((e / (inner * dl)) * dg + rank * dl + (e / inner) % dl) * inner + e % inner;
}

// This rank's slice of one kind of a tensor, gathered from every saved piece that overlaps it: no full
// global tensor is built, so memory stays at the local shard size whatever the model. `init` gives the
// values of elements outside the saved tensor (rows beyond a smaller saved vocabulary padding).
std::vector<float> assemble_local(const Opened& o, const std::string& name, const char* kind, const std::vector<int64_t>& saved,
                                  const ParamInfo& p, const float* init) {
  std::vector<float> local(static_cast<size_t>(p.numel));
  if (init) std::memcpy(local.data(), init, local.size() * sizeof(float));
  std::vector<bool> seen(local.size(), false);
  const auto& gs = p.global_shape;
  const auto& ls = p.local_shape;
  const int dim = p.shard_count > 1 ? p.shard_dim : -1;
  int64_t inner = 1;
  for (size_t d = dim < 0 ? ls.size() : static_cast<size_t>(dim) + 1; d < ls.size(); ++d) inner *= ls[d];
  const int64_t dl = dim < 0 ? 1 : ls[static_cast<size_t>(dim)], dg = dim < 0 ? 1 : gs[static_cast<size_t>(dim)];
  const int64_t cols = saved.size() == 2 ? saved[1] : 1;
  const int64_t saved_rows = saved.empty() ? 1 : saved[0];
  const int64_t target_rows = gs.empty() ? 1 : gs[0];
  for (const auto& pc : o.meta["tensors"][name]["shards"]) {
    if (pc["kind"] != kind) continue;
    const int sdim = pc["shard_dim"].get<int>();
    const auto srank = pc["shard_rank"].get<int64_t>();
    const auto sls = pc["local_shape"].get<std::vector<int64_t>>();
    // Skip pieces whose slice along the shared shard dimension cannot meet ours.
    if (dim >= 0 && sdim == dim && pc["shard_count"].get<int64_t>() > 1 && saved == gs) {
      const int64_t sdl = sls[static_cast<size_t>(sdim)];
      if (srank * sdl >= (p.shard_rank + 1) * dl || (srank + 1) * sdl <= p.shard_rank * dl) continue;
    }
    const auto data = read_piece(o.dir, pc);
    const auto lo = pc["range"][0].get<int64_t>();
    if (dim < 0 && (sdim < 0 || pc["shard_count"].get<int64_t>() == 1) && saved == gs) {
      // Both sides hold the whole tensor: the piece is a contiguous range of ours.
      std::memcpy(local.data() + lo, data.data(), data.size() * sizeof(float));
      std::fill(seen.begin() + lo, seen.begin() + lo + static_cast<int64_t>(data.size()), true);
      continue;
    }
    for (size_t k = 0; k < data.size(); ++k) {
      const int64_t g = to_global(sls, saved, sdim, srank, lo + static_cast<int64_t>(k));
      // Same coordinates in the target's global shape (only the vocabulary rows may differ).
      const int64_t r = saved.size() == 2 ? g / cols : g;
      if (saved.size() == 2 && r >= target_rows) continue;
      const int64_t tg = saved.size() == 2 ? r * cols + g % cols : g;
      int64_t e = tg;
      if (dim >= 0) {
        const int64_t mid = (tg / inner) % dg;
        if (mid / dl != p.shard_rank) continue;
        e = ((tg / (inner * dg)) * dl + mid % dl) * inner + tg % inner;
      }
      local[static_cast<size_t>(e)] = data[k];
      seen[static_cast<size_t>(e)] = true;
    }
  }
  for (int64_t e = 0; e < p.numel; ++e) {
    int64_t g = e;
    if (dim >= 0) g = ((e / (inner * dl)) * dg + p.shard_rank * dl + (e / inner) % dl) * inner + e % inner;
    const bool inside = saved.size() != 2 || g / (gs.size() == 2 ? gs[1] : 1) < saved_rows;
    if (inside && !seen[static_cast<size_t>(e)]) {
      throw DataError(o.dir.string() + ": tensor " + name + " (" + kind + ") is incomplete: shards are missing");
    }
  }
  return local;
}

bool has_kind(const Opened& o, const std::string& name, const char* kind) {
  for (const auto& pc : o.meta["tensors"][name]["shards"]) {
    if (pc["kind"] == kind) return true;
  }
  return false;
}

}  // namespace

TrainState load_checkpoint(const std::string& dir, const LoadOptions& lo, ParamStore& params, Optimizer& opt, LossScaler& scaler) {
  const Opened o = open_checkpoint(dir, lo.step);
  const json& tensors = o.meta["tensors"];
  const bool opt_saved = o.meta["optimizer"]["saved"].get<bool>();
  if (lo.load_optimizer && !opt_saved) {
    throw DataError(o.dir.string() + " was saved without optimizer state (--no-save-optim): load it with --no-load-optim or --finetune");
  }
  if (lo.load_optimizer && !lo.optimizer_kind.empty() && o.meta["optimizer"]["kind"].get<std::string>() != lo.optimizer_kind) {
    throw DataError(o.dir.string() + " holds " + o.meta["optimizer"]["kind"].get<std::string>() + " optimizer state, this run uses --optimizer " +
                    lo.optimizer_kind + ": load with --no-load-optim (fresh optimizer state) or keep the optimizer");
  }
  // NullTokenizer's vocabulary was --vocab-size before it became Megatron's --vocab-size + 1: those checkpoints load.
  const bool null_tokenizer_before = lo.run_config && lo.run_config->data.tokenizer_type.value_or("") == "NullTokenizer" &&
                                     o.meta.contains("vocab_size") && o.meta["vocab_size"].get<int64_t>() + 1 == lo.vocab_size;
  if (lo.vocab_size > 0 && o.meta.contains("vocab_size") && o.meta["vocab_size"].get<int64_t>() != lo.vocab_size && !null_tokenizer_before) {
    throw DataError(o.dir.string() + " was trained with a vocabulary of " + std::to_string(o.meta["vocab_size"].get<int64_t>()) +
                    " tokens, this run has " + std::to_string(lo.vocab_size) + ": use the same tokenizer");
  }
  const bool upcycle = lo.upcycle && lo.run_config;
  if (upcycle) check_upcycling_destination(*lo.run_config);
  if (lo.run_config && o.meta.contains("config") && o.meta["config"].is_string()) {
    // Another model can have the same tensor shapes (8 heads of 64 for 4 of 128): compare what the model is.
    Config saved;
    bool readable = true;
    try {
      apply_yaml_text(saved, o.meta["config"].get<std::string>(), "the checkpoint's configuration");
    } catch (const std::exception&) {
      readable = false;  // written by a version with other flags: the shapes below still guard the load
    }
    if (upcycle && readable && saved.moe.num_experts) {
      throw DataError(o.dir.string() + " holds an MoE model already (" + std::to_string(*saved.moe.num_experts) +
                      " experts): --moe-use-upcycling loads a dense model's checkpoint; to continue this one drop --moe-use-upcycling");
    }
    const Config expected = upcycle ? upcycling_dense_config(*lo.run_config) : *lo.run_config;
    const std::vector<std::string> diff = readable ? model_identity_differences(saved, expected) : std::vector<std::string>{};
    if (!diff.empty()) {
      std::string list;
      for (const auto& d : diff) list += (list.empty() ? "" : "; ") + d;
      throw DataError(o.dir.string() + " holds another model (" + list + "): " +
                      (upcycle ? "--moe-use-upcycling needs the dense model of the run's shape, its MLP --moe-ffn-hidden-size x "
                                 "--moe-upcycling-granularity wide"
                               : "give the checkpoint's settings, or --use-checkpoint-args"));
    }
  }
  const auto model_tensors = lo.model_tensors > 0 ? static_cast<size_t>(lo.model_tensors) : params.size();
  if (!upcycle && tensors.size() != model_tensors) {
    throw DataError(o.dir.string() + " holds " + std::to_string(tensors.size()) + " tensors, the model has " + std::to_string(model_tensors) +
                    ": the model differs from the checkpoint's (--use-checkpoint-args takes its shape)");
  }
  // Where each parameter comes from: its own tensor, or (upcycling) a slice of a dense tensor, or (nullopt) nowhere.
  std::vector<std::optional<UpcycleSource>> sources(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    sources[i] = upcycle ? upcycling_source(*lo.run_config, params.info(i)) : UpcycleSource{params.info(i), 1.0f};
  }
  // Shapes first, for every tensor: a mismatch names the tensor and both shapes.
  for (size_t i = 0; i < params.size(); ++i) {
    if (!sources[i]) continue;
    const ParamInfo& p = sources[i]->view;
    if (!tensors.contains(p.name)) throw DataError(o.dir.string() + " has no tensor " + p.name + ": the model differs from the checkpoint's");
    const auto saved = tensors[p.name]["global_shape"].get<std::vector<int64_t>>();
    bool ok = saved == p.global_shape;
    // Vocabulary padding depends on TP: embedding rows may differ; the common rows are copied.
    const bool vocab = p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    if (!ok && vocab && saved.size() == 2 && saved[1] == p.global_shape[1]) ok = true;
    if (!ok) {
      throw DataError("tensor " + p.name + ": the checkpoint holds " + shape_str(saved) + ", the model expects " + shape_str(p.global_shape) +
                      (upcycle ? ": upcycling needs the dense model's MLP --moe-ffn-hidden-size x --moe-upcycling-granularity wide (and its "
                                 "dense layers' --ffn-hidden-size that wide)"
                               : ": use the checkpoint's model flags (--use-checkpoint-args)"));
    }
  }
  const bool want_optim = lo.load_optimizer && !lo.finetune && !upcycle;
  // Segments of the optimizer by parameter, so parameters load independently (in parallel).
  std::vector<std::vector<const Optimizer::Segment*>> segs(params.size());
  for (const auto& seg : opt.segments()) segs[seg.param].push_back(&seg);
  parallel_for(params.size(), [&](size_t i) {
    float* w = params.param(i);
    if (!sources[i]) {  // (upcycling) the fp32 initial values, the router's rows repeated at a granularity above 1
      const ParamInfo& p = params.info(i);
      std::vector<float> initial(static_cast<size_t>(p.numel));
      params.initial_values(i, static_cast<uint64_t>(lo.run_config->training.seed), initial.data(), 0, p.numel);
      repeat_router_rows(*lo.run_config, p, initial.data());
      for (int64_t e = 0; e < p.numel; ++e) w[e] = opt.to_working(initial[static_cast<size_t>(e)]);  // (every element: no gather before the save)
      for (const Optimizer::Segment* sg : segs[i]) {
        const size_t bytes = static_cast<size_t>(sg->end - sg->begin) * sizeof(float);
        if (opt.master()) std::memcpy(opt.master() + sg->state, initial.data() + (sg->begin - p.offset), bytes);
      }
      return;
    }
    const ParamInfo& p = sources[i]->view;  // (p.offset: the parameter's own)
    const auto saved = tensors[p.name]["global_shape"].get<std::vector<int64_t>>();
    const bool master_saved = has_kind(o, p.name, "master");
    // The most precise saved copy of the weights: fp32 master weights when present.
    auto weights = assemble_local(o, p.name, master_saved ? "master" : "param", saved, p, w);
    if (sources[i]->scale != 1.0f) {
      for (float& x : weights) x *= sources[i]->scale;
    }
    if (upcycle) {
      // The working copy rounded on every rank for every element, as a fresh run's (the save before the first step
      // writes it without a parameter gather).
      for (int64_t e = 0; e < p.numel; ++e) w[e] = opt.to_working(weights[static_cast<size_t>(e)]);
    } else {
      // The working copy: the saved (rounded) one when this run keeps fp32 master weights, else the most precise saved copy.
      const auto working = (master_saved && opt.master()) ? assemble_local(o, p.name, "param", saved, p, w) : weights;
      std::memcpy(w, working.data(), static_cast<size_t>(p.numel) * sizeof(float));
    }
    if (p.trainable && (opt.master() || want_optim)) {  // (a buffer such as the expert bias has no optimizer state)
      const std::vector<float> zeros(static_cast<size_t>(p.numel), 0.0f);
      const auto m = want_optim ? assemble_local(o, p.name, "exp_avg", saved, p, zeros.data()) : std::vector<float>();
      const bool sq = want_optim && opt.exp_avg_sq() && has_kind(o, p.name, "exp_avg_sq");
      const auto v = sq ? assemble_local(o, p.name, "exp_avg_sq", saved, p, zeros.data()) : std::vector<float>();
      for (const Optimizer::Segment* sg : segs[i]) {
        const int64_t e0 = sg->begin - p.offset;
        const size_t bytes = static_cast<size_t>(sg->end - sg->begin) * sizeof(float);
        if (opt.master()) std::memcpy(opt.master() + sg->state, weights.data() + e0, bytes);
        if (want_optim) {
          std::memcpy(opt.exp_avg() + sg->state, m.data() + e0, bytes);
          if (sq) std::memcpy(opt.exp_avg_sq() + sg->state, v.data() + e0, bytes);
        }
      }
    }
  });
  if (opt.master()) opt.refresh_working_weights();  // bf16 / fp16 copies of what was loaded
  opt.round_stored_moments();                        // --exp-avg-dtype / --exp-avg-sq-dtype bf16: the loaded moments stored so
  TrainState st;
  if (upcycle) {  // (Megatron: training from iteration 0 with no FLOPs counted, at the dense run's data position, a fresh schedule)
    if (!lo.finetune) st.consumed_samples = st.lr_schedule_start_samples = o.meta["consumed_samples"].get<int64_t>();
    return st;
  }
  if (lo.finetune) return st;
  st.iteration = o.meta["iteration"].get<int64_t>();
  st.consumed_samples = o.meta["consumed_samples"].get<int64_t>();
  st.lr_schedule_start_samples = o.meta.value("lr_schedule_start_samples", int64_t{0});
  // --no-load-optim: Megatron loads no opt_param_scheduler state then, so its schedule starts again at the load
  // (warmup included) while the iteration and the data continue.
  if (!lo.load_optimizer) st.lr_schedule_start_samples = st.consumed_samples;
  st.flops_so_far = o.meta["flops_so_far"].get<double>();
  st.skipped = o.meta["skipped_iterations"].get<int64_t>();
  st.nan_iterations = o.meta["nan_iterations"].get<int64_t>();
  if (want_optim) {
    opt.set_iterations(o.meta["optimizer"]["step"].get<int64_t>());
    const auto& ls = o.meta["loss_scaler"];
    // "dynamic" is absent from older checkpoints: their scale is not trusted (a fresh dynamic scale instead).
    st.scaler = {ls["scale"].get<float>(), ls["hysteresis_left"].get<int64_t>(), ls["clean_steps"].get<int64_t>(), ls.value("dynamic", false)};
    scaler.restore(st.scaler);
  }
  return st;
}

std::map<int64_t, std::vector<float>> load_fp8_scaling(const std::string& dir, std::optional<int64_t> step, const std::vector<int64_t>& layers,
                                                       int64_t* history_len) {
  const Opened o = open_checkpoint(dir, step);
  std::map<int64_t, std::vector<float>> out;
  *history_len = 0;
  if (!o.meta.contains("fp8_scaling")) return out;
  const json& saved = o.meta["fp8_scaling"];
  for (int64_t layer : layers) {
    const std::string name = fp8_scaling_piece(layer, false);
    if (!saved.contains(name)) continue;
    const auto shape = saved[name]["global_shape"].get<std::vector<int64_t>>();
    if (shape.size() != 3 || shape[0] != kFp8Sites || shape[1] != 3 || shape[2] < 2) {
      throw DataError(o.dir.string() + ": " + name + " has the shape " + shape_str(shape) + ", not [4, 3, 1 + history]: the checkpoint is damaged");
    }
    *history_len = shape[2] - 1;
    out[layer] = read_piece(o.dir, saved[name]["shards"].at(0));
    // An MoE layer's experts' sites, after the layer's (add_fp8_scaling).
    const std::string experts = fp8_scaling_piece(layer, true);
    if (saved.contains(experts)) {
      const auto eshape = saved[experts]["global_shape"].get<std::vector<int64_t>>();
      if (eshape.size() != 3 || eshape[0] % 2 != 0 || eshape[1] != 3 || eshape[2] != shape[2]) {
        throw DataError(o.dir.string() + ": " + experts + " has the shape " + shape_str(eshape) + ", not [2 x experts, 3, " +
                        std::to_string(shape[2]) + "]: the checkpoint is damaged");
      }
      const std::vector<float> more = read_piece(o.dir, saved[experts]["shards"].at(0));
      out[layer].insert(out[layer].end(), more.begin(), more.end());
    }
  }
  return out;
}

std::string checkpoint_config_yaml(const std::string& dir, std::optional<int64_t> step) {
  return open_checkpoint(dir, step).meta["config"].get<std::string>();
}

CheckpointInfo checkpoint_info(const std::string& dir, std::optional<int64_t> step) {
  const Opened o = open_checkpoint(dir, step);
  CheckpointInfo info;
  info.dir = o.dir.string();
  info.iteration = o.meta["iteration"].get<int64_t>();
  info.config_yaml = o.meta["config"].get<std::string>();
  info.vocab_size = o.meta.value("vocab_size", int64_t{0});
  if (o.meta.contains("lr_schedule")) info.lr_schedule_json = o.meta["lr_schedule"].dump();
  info.has_optimizer = o.meta["optimizer"].value("saved", false);
  for (const auto& [name, t] : o.meta["tensors"].items()) info.shapes[name] = t["global_shape"].get<std::vector<int64_t>>();
  return info;
}

std::string inspect_checkpoint(const std::string& dir, std::optional<int64_t> step, bool verify) {
  const Opened o = open_checkpoint(dir, step);
  std::ostringstream out;
  const json& m = o.meta;
  out << "checkpoint " << o.dir.string() << "\n";
  out << "iteration " << m["iteration"] << ", consumed samples " << m["consumed_samples"] << ", FLOPs so far "
      << m["flops_so_far"].get<double>() << "\n";
  if (m.value("lr_schedule_start_samples", int64_t{0}) > 0) {
    out << "learning-rate schedule started at " << m["lr_schedule_start_samples"] << " consumed samples (an upcycled model, or a load with --no-load-optim)\n";
  }
  if (m.contains("lr_schedule")) out << "learning-rate schedule (checked at a resume): " << m["lr_schedule"].dump() << "\n";
  out << "layout: " << m["layout"].dump() << "\n";
  out << "optimizer: " << m["optimizer"].dump() << "; loss scaler: " << m["loss_scaler"].dump() << "\n";
  int64_t total = 0, bytes = 0, pieces = 0;
  out << "tensors:\n";
  for (const auto& [name, t] : m["tensors"].items()) {
    int64_t n = 1;
    for (auto d : t["global_shape"]) n *= d.get<int64_t>();
    total += n;
    std::map<std::string, int> kinds;
    for (const auto& pc : t["shards"]) {
      kinds[pc["kind"].get<std::string>()]++;
      bytes += pc["bytes"].get<int64_t>();
      ++pieces;
      if (verify) read_piece(o.dir, pc);
    }
    out << "  " << name << " " << shape_str(t["global_shape"].get<std::vector<int64_t>>()) << " fp32, shards:";
    for (const auto& [k, c] : kinds) out << " " << k << " x" << c;
    out << "\n";
  }
  if (m.contains("fp8_scaling")) {
    int64_t history = 0, layers = 0, moe_layers = 0, experts = 0;
    for (const auto& [name, t] : m["fp8_scaling"].items()) {
      history = t["global_shape"].back().get<int64_t>() - 1;
      if (name.find(".mlp.experts.") != std::string::npos) {
        experts += t["global_shape"].front().get<int64_t>() / 2;
        ++moe_layers;
      } else {
        ++layers;
      }
      for (const auto& pc : t["shards"]) {
        bytes += pc["bytes"].get<int64_t>();
        ++pieces;
        if (verify) read_piece(o.dir, pc);
      }
    }
    out << "FP8 delayed scaling: the scales and amax histories (" << history << " entries) of " << layers << " layers";
    if (experts > 0) out << ", with the experts of " << moe_layers << " MoE layers (" << experts << " in all)";
    out << "\n";
  }
  out << total << " parameters, " << pieces << " pieces, " << bytes << " bytes in " << o.dir.string() << "\n";
  if (verify) out << "all checksums verified\n";
  return out.str();
}

}  // namespace mt
