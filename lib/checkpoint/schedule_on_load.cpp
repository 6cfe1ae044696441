// schedule_on_load.cpp: see schedule_on_load.h.
#include "checkpoint/schedule_on_load.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "config/errors.h"

namespace mt {
namespace {

using json = nlohmann::json;

std::string number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

LrSchedule::Settings parse(const std::string& text, const std::string& dir) {
  try {
    const json j = json::parse(text);
    LrSchedule::Settings s;
    s.max_lr = j.at("max_lr").get<double>();
    s.min_lr = j.at("min_lr").get<double>();
    s.init_lr = j.at("init_lr").get<double>();
    s.warmup_samples = j.at("warmup_samples").get<int64_t>();
    s.decay_samples = j.at("decay_samples").get<int64_t>();
    s.wsd_decay_samples = j.at("wsd_decay_samples").get<int64_t>();
    s.style = j.at("decay_style").get<std::string>();
    s.wsd_style = j.at("wsd_decay_style").get<std::string>();
    return s;
  } catch (const json::exception& e) {
    throw ConfigError("the checkpoint in " + dir + " has a damaged 'lr_schedule' in its metadata.json (" + e.what() +
                      "): add --override-opt_param-scheduler to train with this command's schedule");
  }
}

}  // namespace

std::string lr_schedule_to_json(const LrSchedule::Settings& s) {
  return json{{"max_lr", s.max_lr},
              {"min_lr", s.min_lr},
              {"init_lr", s.init_lr},
              {"warmup_samples", s.warmup_samples},
              {"decay_samples", s.decay_samples},
              {"wsd_decay_samples", s.wsd_decay_samples},
              {"decay_style", s.style},
              {"wsd_decay_style", s.wsd_style}}
      .dump();
}

std::string reconcile_lr_schedule(Config& cfg, const std::string& saved_json, const std::string& checkpoint_dir) {
  const LrSchedule::Settings saved = parse(saved_json, checkpoint_dir), mine = LrSchedule(cfg).settings();
  const bool wsd = mine.style == "WSD" || saved.style == "WSD";
  // (the settings Megatron checks, in its words; the rates compared as saved, exactly, as Megatron's assert does)
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
  rate("learning rate (--lr)", saved.max_lr, mine.max_lr);
  rate("minimum learning rate (--min-lr)", saved.min_lr, mine.min_lr);
  rate("warmup's first learning rate (--lr-warmup-init)", saved.init_lr, mine.init_lr);
  samples("warmup (--lr-warmup-iters / -samples / -fraction)", saved.warmup_samples, mine.warmup_samples);
  samples("decay (--lr-decay-iters / -samples, else --train-iters / --train-samples)", saved.decay_samples, mine.decay_samples);
  if (saved.style != mine.style) differ.push_back({"decay style (--lr-decay-style)", saved.style, mine.style});
  if (wsd) {
    samples("WSD's final decay (--lr-wsd-decay-iters)", saved.wsd_decay_samples, mine.wsd_decay_samples);
    if (saved.wsd_style != mine.wsd_style) differ.push_back({"WSD's decay style (--lr-wsd-decay-style)", saved.wsd_style, mine.wsd_style});
  }
  if (differ.empty()) return "";
  const auto& ck = cfg.checkpoint;
  if (ck.override_opt_param_scheduler) {
    return "--override-opt_param-scheduler: the learning-rate schedule is this command's (the checkpoint's " + differ[0].name + " was " +
           differ[0].saved + ", now " + differ[0].mine + (differ.size() > 1 ? ", and " + std::to_string(differ.size() - 1) + " more" : "") + ")";
  }
  if (!ck.use_checkpoint_opt_param_scheduler) {
    throw ConfigError("the checkpoint in " + checkpoint_dir + " was trained with another learning-rate schedule: its " + differ[0].name + " is " +
                      differ[0].saved + ", this command's " + differ[0].mine +
                      (differ.size() > 1 ? " (and " + std::to_string(differ.size() - 1) + " more)" : "") +
                      ". As Megatron, megatrain refuses to change it silently: add --override-opt_param-scheduler to train with this "
                      "command's schedule, or --use-checkpoint-opt_param-scheduler to keep the checkpoint's");
  }
  // The checkpoint's schedule, in samples (the global batch size may differ from the run that saved it).
  auto& t = cfg.training;
  t.lr = saved.max_lr;
  t.min_lr = saved.min_lr;
  t.lr_warmup_init = saved.init_lr;
  t.lr_warmup_iters = 0;
  t.lr_warmup_fraction.reset();
  t.lr_warmup_samples = saved.warmup_samples;
  t.lr_decay_iters.reset();
  t.lr_decay_samples = saved.decay_samples;
  t.lr_decay_style = saved.style;
  t.lr_wsd_decay_style = saved.wsd_style;
  const int64_t gbs = std::max<int64_t>(1, cfg.derived.global_batch_size);
  if (wsd) t.lr_wsd_decay_iters = (saved.wsd_decay_samples + gbs - 1) / gbs;
  return "--use-checkpoint-opt_param-scheduler: the learning-rate schedule is the checkpoint's (its " + differ[0].name + " " + differ[0].saved +
         (differ.size() > 1 ? ", and " + std::to_string(differ.size() - 1) + " more" : "") + ")";
}

}  // namespace mt
