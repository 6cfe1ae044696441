// metadata_check.cpp: the checks, field by field.
#include "checkpoint/metadata_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/errors.h"

namespace mt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int64_t kMaxExact = int64_t{1} << 53;  // integers JSON numbers hold exactly

struct Checker {
  const fs::path& file;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw DataError(file.string() + (where.empty() ? "" : ", " + where) + ": " + what + " (the checkpoint's metadata is damaged)");
  }
  const json& field(const json& obj, const char* name, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(name)) fail(where, std::string("no field '") + name + "'");
    return obj[name];
  }
  int64_t integer(const json& obj, const char* name, const std::string& where, int64_t lo, int64_t hi) const {
    const json& v = field(obj, name, where);
    if (!v.is_number_integer()) fail(where, std::string("'") + name + "' is not an integer");
    const auto x = v.get<int64_t>();
    if (x < lo || x > hi) fail(where, std::string("'") + name + "' is " + std::to_string(x) + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  std::vector<int64_t> shape(const json& obj, const char* name, const std::string& where) const {
    const json& v = field(obj, name, where);
    if (!v.is_array() || v.size() > 8) fail(where, std::string("'") + name + "' is not a shape");
    std::vector<int64_t> out;
    int64_t n = 1;
    for (const auto& d : v) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > kMaxExact) fail(where, std::string("'") + name + "' has a bad dimension");
      out.push_back(d.get<int64_t>());
      if (n > kMaxExact / out.back()) fail(where, std::string("'") + name + "' is too large");
      n *= out.back();
    }
    return out;
  }
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

}  // namespace

void check_checkpoint_metadata(const json& meta, const fs::path& metadata, int64_t iteration) {
  const Checker k{metadata};
  if (!meta.is_object()) k.fail("", "not a JSON object");
  const int64_t it = k.integer(meta, "iteration", "", 0, kMaxExact);
  if (it != iteration) k.fail("", "'iteration' is " + std::to_string(it) + " in the directory of iteration " + std::to_string(iteration));
  const int64_t consumed = k.integer(meta, "consumed_samples", "", 0, kMaxExact);
  if (meta.contains("lr_schedule_start_samples") && k.integer(meta, "lr_schedule_start_samples", "", 0, kMaxExact) > consumed) {
    k.fail("", "'lr_schedule_start_samples' exceeds 'consumed_samples'");
  }
  if (meta.contains("lr_schedule")) {  // (the schedule a resume checks; checkpoint/schedule_on_load.h)
    const json& sc = k.field(meta, "lr_schedule", "");
    for (const char* rate : {"max_lr", "min_lr", "weight_decay"}) {
      const json& v = k.field(sc, rate, "lr_schedule");
      if (!v.is_number() || !std::isfinite(v.get<double>())) k.fail("lr_schedule", std::string("'") + rate + "' is not a finite number");
    }
    for (const char* samples : {"warmup_samples", "decay_samples", "train_samples"}) k.integer(sc, samples, "lr_schedule", 0, kMaxExact);
    if (!k.field(sc, "decay_style", "lr_schedule").is_string()) k.fail("lr_schedule", "'decay_style' is not a string");
    for (const char* rate : {"decoupled_lr", "decoupled_min_lr"}) {
      const json& v = k.field(sc, rate, "lr_schedule");
      if (!v.is_null() && (!v.is_number() || !std::isfinite(v.get<double>()))) k.fail("lr_schedule", std::string("'") + rate + "' is not null or a finite number");
    }
  }
  k.integer(meta, "skipped_iterations", "", 0, kMaxExact);
  k.integer(meta, "nan_iterations", "", 0, kMaxExact);
  const json& flops = k.field(meta, "flops_so_far", "");
  if (!flops.is_number() || !std::isfinite(flops.get<double>()) || flops.get<double>() < 0) k.fail("", "'flops_so_far' is not a non-negative number");
  const json& opt = k.field(meta, "optimizer", "");
  if (!k.field(opt, "saved", "optimizer").is_boolean() || !k.field(opt, "kind", "optimizer").is_string()) k.fail("optimizer", "bad 'saved' or 'kind'");
  k.integer(opt, "step", "optimizer", 0, kMaxExact);
  const json& ls = k.field(meta, "loss_scaler", "");
  const json& scale = k.field(ls, "scale", "loss_scaler");
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) || scale.get<double>() <= 0) k.fail("loss_scaler", "'scale' is not a positive number");
  k.integer(ls, "hysteresis_left", "loss_scaler", 0, kMaxExact);
  k.integer(ls, "clean_steps", "loss_scaler", 0, kMaxExact);
  if (!k.field(meta, "config", "").is_string()) k.fail("", "'config' is not text");
  const json& tensors = k.field(meta, "tensors", "");
  if (!tensors.is_object()) k.fail("", "'tensors' is not an object");
  const fs::path dir = metadata.parent_path();
  std::map<std::string, int64_t> file_size;
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> file_ranges;  // per shard file: its pieces' byte ranges
  // The model's tensors, then FP8's delayed-scaling state (the same pieces, in the same shard files) where saved.
  std::vector<std::pair<std::string, const json*>> all;
  for (const auto& [name, t] : tensors.items()) all.emplace_back(name, &t);
  if (meta.contains("fp8_scaling")) {
    if (!meta["fp8_scaling"].is_object()) k.fail("", "'fp8_scaling' is not an object");
    for (const auto& [name, t] : meta["fp8_scaling"].items()) all.emplace_back(name, &t);
  }
  for (const auto& [name, tp] : all) {
    const json& t = *tp;
    const std::string where = "tensor " + name;
    const std::vector<int64_t> global = k.shape(t, "global_shape", where);
    const json& shards = k.field(t, "shards", where);
    if (!shards.is_array() || shards.empty()) k.fail(where, "no shards");
    // Per (kind, shard dim, shard rank, shard count): the element ranges of its pieces, which must not overlap.
    std::map<std::tuple<std::string, int64_t, int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> slices;
    for (const auto& pc : shards) {
      const json& fname = k.field(pc, "file", where);
      if (!fname.is_string()) k.fail(where, "'file' is not a name");
      const std::string f = fname.get<std::string>();
      if (f.size() != 14 || f.rfind("rank_", 0) != 0 || f.find_first_not_of("0123456789", 5) != 10 || f.substr(10) != ".bin") {
        k.fail(where, "'file' " + f + " is not a shard of this checkpoint");
      }
      if (!file_size.count(f)) {
        std::error_code ec;
        const auto size = fs::file_size(dir / f, ec);
        if (ec) k.fail(where, "shard " + f + " is missing");
        file_size[f] = static_cast<int64_t>(size);
      }
      const int64_t offset = k.integer(pc, "offset", where, 0, kMaxExact);
      const int64_t bytes = k.integer(pc, "bytes", where, 0, kMaxExact);
      if (bytes % 4 != 0) k.fail(where, "'bytes' " + std::to_string(bytes) + " is not whole fp32 values");
      if (offset + bytes > file_size[f]) k.fail(where, "bytes " + std::to_string(offset) + ".." + std::to_string(offset + bytes) + " lie outside " + f);
      file_ranges[f].emplace_back(offset, offset + bytes);
      const json& kind = k.field(pc, "kind", where);
      if (!kind.is_string()) k.fail(where, "'kind' is not a name");
      if (!k.field(pc, "checksum", where).is_string()) k.fail(where, "'checksum' is not text");
      if (k.shape(pc, "global_shape", where) != global) k.fail(where, "a piece's 'global_shape' differs from the tensor's");
      const std::vector<int64_t> local = k.shape(pc, "local_shape", where);
      const int64_t count = k.integer(pc, "shard_count", where, 1, kMaxExact);
      const int64_t dim = k.integer(pc, "shard_dim", where, -1, static_cast<int64_t>(global.size()) - 1);
      const int64_t rank = k.integer(pc, "shard_rank", where, 0, count - 1);
      if (local.size() != global.size()) k.fail(where, "'local_shape' has another rank than the global shape");
      for (size_t d = 0; d < global.size(); ++d) {
        const bool split = static_cast<int64_t>(d) == dim && count > 1;
        if (split ? local[d] > global[d] / count || local[d] * count != global[d] : local[d] != global[d]) {
          k.fail(where, "'local_shape' is not a slice of the global shape");
        }
      }
      const json& range = k.field(pc, "range", where);
      if (!range.is_array() || range.size() != 2 || !range[0].is_number_integer() || !range[1].is_number_integer()) k.fail(where, "'range' is not [lo, hi]");
      const auto lo = range[0].get<int64_t>(), hi = range[1].get<int64_t>();
      if (lo < 0 || hi < lo || hi > numel(local)) k.fail(where, "'range' [" + std::to_string(lo) + ", " + std::to_string(hi) + ") lies outside the shard");
      if ((hi - lo) * 4 != bytes) k.fail(where, "'range' holds " + std::to_string(hi - lo) + " values, 'bytes' " + std::to_string(bytes / 4));
      slices[{kind.get<std::string>(), dim, rank, count}].emplace_back(lo, hi);
    }
    for (auto& [key, ranges] : slices) {
      std::sort(ranges.begin(), ranges.end());
      for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) k.fail(where, "two pieces overlap (" + std::get<0>(key) + ")");
      }
    }
  }
  for (auto& [f, ranges] : file_ranges) {
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) k.fail("shard " + f, "two pieces share bytes");
    }
  }
}

}  // namespace mt
