// schedule_on_load.cpp: see schedule_on_load.h.
#include "checkpoint/schedule_on_load.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "config/errors.h"

namespace mt {
namespace {

using json = nlohmann::json;

// The shortest text that reads back as the same double (two rates apart in their 10th digit print apart).
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// What Megatron's OptimizerParamScheduler state holds and checks at a load, with megatrain's decoupled rates (Megatron
// keeps those in the optimizer's parameter groups, which a load restores).
struct Saved {
  double max_lr = 0, min_lr = 0, weight_decay = 0;
  int64_t warmup_samples = 0, decay_samples = 0, train_samples = 0;
  std::string style;
  std::optional<double> decoupled_lr, decoupled_min_lr;
};

Saved of(const Config& cfg) {
  const LrSchedule::Settings s = LrSchedule(cfg).settings();
  const auto& t = cfg.training;
  const int64_t gbs = std::max<int64_t>(1, cfg.derived.global_batch_size);
  Saved v;
  v.max_lr = s.max_lr;
  v.min_lr = s.min_lr;
  v.weight_decay = t.weight_decay;
  v.warmup_samples = s.warmup_samples;
  v.decay_samples = s.decay_samples;
  v.train_samples = t.train_iters ? *t.train_iters * gbs : t.train_samples.value_or(0);  // (Megatron's wd_incr_steps)
  v.style = s.style;
  if (t.decoupled_lr) {
    v.decoupled_lr = *t.decoupled_lr;
    v.decoupled_min_lr = t.decoupled_min_lr.value_or(t.min_lr);
  }
  return v;
}

Saved parse(const std::string& text, const std::string& dir) {
  try {
    const json j = json::parse(text);
    Saved v;
    v.max_lr = j.at("max_lr").get<double>();
    v.min_lr = j.at("min_lr").get<double>();
    v.weight_decay = j.at("weight_decay").get<double>();
    v.warmup_samples = j.at("warmup_samples").get<int64_t>();
    v.decay_samples = j.at("decay_samples").get<int64_t>();
    v.train_samples = j.at("train_samples").get<int64_t>();
    v.style = j.at("decay_style").get<std::string>();
    if (!j.at("decoupled_lr").is_null()) {
      v.decoupled_lr = j.at("decoupled_lr").get<double>();
      v.decoupled_min_lr = j.at("decoupled_min_lr").get<double>();
    }
    return v;
  } catch (const json::exception& e) {
    throw DataError("the checkpoint in " + dir + " has a damaged 'lr_schedule' in its metadata.json (" + e.what() +
                    "): add --override-opt_param-scheduler to train with this command's schedule");
  }
}

}  // namespace

std::string lr_schedule_to_json(const Config& cfg) {
  const Saved v = of(cfg);
  return json{{"max_lr", v.max_lr},
              {"min_lr", v.min_lr},
              {"weight_decay", v.weight_decay},
              {"warmup_samples", v.warmup_samples},
              {"decay_samples", v.decay_samples},
              {"train_samples", v.train_samples},
              {"decay_style", v.style},
              {"decoupled_lr", v.decoupled_lr ? json(*v.decoupled_lr) : json(nullptr)},
              {"decoupled_min_lr", v.decoupled_min_lr ? json(*v.decoupled_min_lr) : json(nullptr)}}
      .dump();
}

std::string reconcile_lr_schedule(Config& cfg, const std::string& saved_json, const std::string& checkpoint_dir) {
  const Saved saved = parse(saved_json, checkpoint_dir), mine = of(cfg);
  // (the settings Megatron checks, in its words; the rates compared exactly, as Megatron's assert does)
  struct Difference {
    std::string name, saved, mine;
  };
  std::vector<Difference> differ;
  const auto rate = [&](const char* name, double a, double b) {
    if (a != b) differ.push_back({name, number(a), number(b)});
  };
  const auto samples = [&](const char* name, int64_t a, int64_t b) {
    if (a != b) differ.push_back({name, std::to_string(a) + " samples", std::to_string(b) + " samples"});
  };
  const auto optional_rate = [&](const char* name, const std::optional<double>& a, const std::optional<double>& b) {
    if (a != b) differ.push_back({name, a ? number(*a) : "unset", b ? number(*b) : "unset"});
  };
  rate("learning rate (--lr)", saved.max_lr, mine.max_lr);
  rate("minimum learning rate (--min-lr)", saved.min_lr, mine.min_lr);
  samples("warmup (--lr-warmup-iters / -samples / -fraction)", saved.warmup_samples, mine.warmup_samples);
  samples("decay (--lr-decay-iters / -samples, else --train-iters / --train-samples)", saved.decay_samples, mine.decay_samples);
  if (saved.style != mine.style) differ.push_back({"decay style (--lr-decay-style)", saved.style, mine.style});
  rate("weight decay (--weight-decay)", saved.weight_decay, mine.weight_decay);
  samples("training length (--train-iters / --train-samples: Megatron's weight-decay increment steps)", saved.train_samples, mine.train_samples);
  optional_rate("decoupled learning rate (--decoupled-lr)", saved.decoupled_lr, mine.decoupled_lr);
  optional_rate("decoupled minimum learning rate (--decoupled-min-lr)", saved.decoupled_min_lr, mine.decoupled_min_lr);
  if (differ.empty()) return "";
  const auto& ck = cfg.checkpoint;
  const std::string more = differ.size() > 1 ? " (and " + std::to_string(differ.size() - 1) + " more)" : "";
  if (ck.override_opt_param_scheduler) {
    return "--override-opt_param-scheduler: the learning-rate schedule is this command's (the checkpoint's " + differ[0].name + " was " +
           differ[0].saved + ", now " + differ[0].mine + more + ")";
  }
  if (!ck.use_checkpoint_opt_param_scheduler) {
    throw ConfigError("the checkpoint in " + checkpoint_dir + " was trained with another learning-rate schedule: its " + differ[0].name + " is " +
                      differ[0].saved + ", this command's " + differ[0].mine + more +
                      ". As Megatron, megatrain refuses to change it silently: add --override-opt_param-scheduler to train with this "
                      "command's schedule, or --use-checkpoint-opt_param-scheduler to keep the checkpoint's");
  }
  // The checkpoint's schedule, in samples (the global batch size may differ from the run that saved it); as Megatron's,
  // the warmup's first rate and WSD's final decay stay the command's, and the training length is the command's own.
  auto& t = cfg.training;
  t.lr = saved.max_lr;
  t.min_lr = saved.min_lr;
  t.weight_decay = saved.weight_decay;
  t.lr_warmup_iters = 0;
  t.lr_warmup_fraction.reset();
  t.lr_warmup_samples = saved.warmup_samples;
  t.lr_decay_iters.reset();
  t.lr_decay_samples = saved.decay_samples;
  t.lr_decay_style = saved.style;
  t.decoupled_lr = saved.decoupled_lr;
  t.decoupled_min_lr = saved.decoupled_min_lr;
  return "--use-checkpoint-opt_param-scheduler: the learning-rate schedule is the checkpoint's (its " + differ[0].name + " " + differ[0].saved +
         more + ")";
}

}  // namespace mt
