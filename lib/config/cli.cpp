// cli.cpp: CLI11 bindings for the flag table.
#include "config/cli.h"

#include "config/errors.h"
#include "config/flags.h"
#include "config/yaml_io.h"

namespace mt {

struct ConfigCli::Holder {
  const FlagSpec* spec = nullptr;
  const AliasSpec* alias = nullptr;
  CLI::Option* opt = nullptr;
  bool flag = false;
  std::string value;
  std::vector<std::string> values;
};

ConfigCli::ConfigCli(CLI::App& app) : app_(app) {
  app.allow_extras(true);
  app.add_option("--config,--yaml-cfg", config_path_, "YAML recipe; keys are flag names (command-line flags override it)")
      ->group("Recipe");
  app.add_flag("--print-config", print_config_, "Print the resolved configuration as YAML and exit")->group("Recipe");
  const Config defaults;
  for (const auto& spec : flag_table()) {
    auto h = std::make_unique<Holder>();
    h->spec = &spec;
    std::string help = spec.help;
    if (!spec.choices.empty()) {
      help += " {";
      for (size_t i = 0; i < spec.choices.size(); ++i) help += (i ? "|" : "") + spec.choices[i];
      help += "}";
    }
    if (flag_is_bool(spec)) {
      h->opt = app.add_flag("--" + spec.name, h->flag, help);
    } else if (flag_is_list(spec)) {
      h->opt = app.add_option("--" + spec.name, h->values, help);
      h->opt->trigger_on_parse();  // (each occurrence replaces the earlier ones' values: the last one wins, as argparse's)
    } else {
      h->opt = app.add_option("--" + spec.name, h->value, help);
      h->opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    h->opt->group(spec.group);
    if (!flag_is_bool(spec)) {
      h->opt->type_name(flag_type_name(spec));
      const std::string dflt = flag_value_text(defaults, spec);
      if (!dflt.empty()) h->opt->default_str(dflt);
    }
    holders_.push_back(std::move(h));
  }
  for (const auto& alias : alias_table()) {
    auto h = std::make_unique<Holder>();
    h->alias = &alias;
    if (alias.takes_list) {
      h->opt = app.add_option("--" + alias.name, h->values, alias.help);
      h->opt->trigger_on_parse();  // (the last occurrence's values, as the flag table's lists)
    } else if (alias.takes_value) {
      h->opt = app.add_option("--" + alias.name, h->value, alias.help);
    } else {
      h->opt = app.add_flag("--" + alias.name, h->flag, alias.help);
    }
    h->opt->group(alias.group);
    holders_.push_back(std::move(h));
  }
}

ConfigCli::~ConfigCli() = default;

namespace {

// Megatron-LM's flags for what megatrain does not do at all: text generation and its inference engines, and
// reinforcement learning (GRPO): "" for any other flag, else what the flag belongs to.
std::string megatron_non_training_flag(const std::string& name) {
  static const char* const kGeneration[] = {
      "--max-tokens-to-oom", "--temperature", "--top_k", "--top_p", "--top-k", "--top-p", "--num-tokens-to-generate", "--return-log-probs",
      "--prompts", "--prompt-file", "--prompt-file-num-truncate", "--stop-words", "--termination-id", "--top-n-logprobs",
      "--incoming-requests-per-sec", "--incoming-requests-per-step", "--output-path", "--output-every-n-results", "--use-coordinator",
      "--use-legacy-static-engine", "--enable-chunked-prefill", "--decode-only-cuda-graphs", "--flash-decode", "--num-speculative-tokens",
      "--suspend-resume-interval", "--suspend-timeout", "--async-mode", "--use-same-sampling-seed-across-dp-ranks",
      "--mamba-inference-conv-states-dtype", "--mamba-inference-ssm-states-dtype", "--output-bert-embeddings", "--bert-embedder-type"};
  for (const char* flag : kGeneration) {
    if (name == flag) return "one of Megatron-LM's text-generation / inference settings";
  }
  if (name.rfind("--inference-", 0) == 0 || name.rfind("--no-inference-", 0) == 0) return "one of Megatron-LM's inference-engine settings";
  if (name.rfind("--rl-", 0) == 0 || name.rfind("--no-rl-", 0) == 0 || name.rfind("--grpo-", 0) == 0 || name == "--perform-rl-step" ||
      name == "--refit-method" || name == "--langrl-env-config") {
    return "one of Megatron-LM's reinforcement-learning (GRPO) settings";
  }
  return "";
}

// Megatron features megatrain does not have, named by their flags' prefixes (families of flags that grow with each
// Megatron release): the feature and what to do instead, for an error that says more than "unknown flag".
std::string megatron_missing_feature(const std::string& name) {
  struct Family {
    const char* prefix;
    bool exact;
    const char* what;
  };
  static const Family kFamilies[] = {
      {"--dsa-", false, "DeepSeek sparse attention (DSA) is not implemented: drop its --dsa-* flags"},
      {"--linear-", false, "linear attention / gated delta net layers are not implemented: drop their --linear-* flags"},
      {"--error-injection-", false, "Megatron's fault injection (its rerun state machine's resilience tests) is not implemented: drop it"},
      {"--hierarchical-context-parallel-sizes", true,
       "hierarchical (a2a+p2p) context parallelism is not implemented: use --cp-comm-type p2p or a2a with --context-parallel-size"},
      {"--megatron-fsdp-", false, "Megatron FSDP is not implemented: shard the optimizer state with --use-distributed-optimizer"},
      {"--use-megatron-fsdp", true, "Megatron FSDP is not implemented: shard the optimizer state with --use-distributed-optimizer"},
      {"--outer-dp-sharding-strategy", true, "Megatron FSDP's hybrid sharding is not implemented: use --use-distributed-optimizer"},
      {"--use-mup", true, "the muP parametrization is not implemented: drop it"},
      {"--mup-", false, "the muP parametrization is not implemented: drop its --mup-* flags"},
      {"--fim-", false, "fill-in-the-middle (FIM) data is not implemented: drop its --fim-* flags"},
      {"--export-", false, "Megatron's post-training (ModelOpt) export is not implemented: megatrain exports with `megatrain checkpoint export --hf`"},
      {"--no-use-layer-wise-param-layout", true, "the Muon optimizer's parameter layout: megatrain has no Muon (--optimizer adam or sgd): drop it"},
  };
  for (const Family& f : kFamilies) {
    if (f.exact ? name == f.prefix : name.rfind(f.prefix, 0) == 0) return f.what;
  }
  return "";
}

}  // namespace

void reject_unknown_arguments(const std::vector<std::string>& remaining) {
  for (const auto& arg : remaining) {
    if (arg.rfind("-", 0) == 0) {
      std::string name = arg.substr(0, arg.find('='));
      if (const std::string what = megatron_non_training_flag(name); !what.empty()) {
        throw ConfigError(name + " is " + what + ": megatrain pretrains models and has no inference engine or RL loop: drop it");
      }
      if (const std::string what = megatron_missing_feature(name); !what.empty()) throw ConfigError(name + ": " + what);
      throw ConfigError("unknown flag " + name + ": did you mean --" + nearest_flag(name) + "? (megatrain --help lists all flags)");
    }
    throw ConfigError("unexpected argument '" + arg + "': flags take the form --name value (megatrain --help)");
  }
}

Config ConfigCli::build() const {
  reject_unknown_arguments(app_.remaining());
  Config cfg;
  if (!config_path_.empty()) apply_yaml_file(cfg, config_path_);
  for (const auto& h : holders_) {
    if (h->opt->count() == 0) continue;
    if (h->alias) {
      std::string value = h->value;
      if (h->alias->takes_list) {
        value.clear();
        for (const auto& v : h->values) value += (value.empty() ? "" : " ") + v;
      }
      if (std::string note = h->alias->apply(cfg, value); !note.empty()) cfg.notes.push_back(std::move(note));
    } else if (flag_is_bool(*h->spec)) {
      set_flag_from_string(cfg, *h->spec, "true", "command line");
    } else if (flag_is_list(*h->spec)) {
      // One quoted argument "0.3 a 0.7 b" is split like Megatron's shell-expanded form. Given twice, the last
      // occurrence's values (argparse's nargs='+': "--data-path a b --data-path c" reads c).
      std::string items;
      for (const auto& v : h->values) items += (items.empty() ? "" : " ") + v;
      set_flag_from_string(cfg, *h->spec, items, "command line");
    } else {
      set_flag_from_string(cfg, *h->spec, h->value, "command line");
    }
  }
  return cfg;
}

}  // namespace mt
