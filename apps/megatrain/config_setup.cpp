// config_setup.cpp: flag parsing, validation and resolution shared by train and plan.
#include "config_setup.h"

#include <filesystem>
#include <iostream>
#include <numeric>

#include "checkpoint/checkpoint.h"
#include "checkpoint/schedule_on_load.h"
#include "config/batch_steps.h"
#include "config/errors.h"
#include "config/flags.h"
#include "config/yaml_io.h"
#include "config/resolve.h"
#include "data/tokenizer.h"

namespace mt {

int64_t known_tokenizer_vocab(const Config& cfg) {
  const std::string t = cfg.data.tokenizer_type.value_or("");
  if (t == "GPT2BPETokenizer") return 50257;
  if (t == "ByteTokenizer") return 257;  // 256 bytes + end of document
  // Its file says (the largest id + 1: the base vocabulary and the added tokens). A recipe may
  // name a tokenizer that is not on this machine (plans, mock data): then --vocab-size stands in, and a run
  // that reads data fails when it builds the tokenizer, naming the path.
  const bool file_based = t == "HuggingFaceTokenizer" || t == "SentencePieceTokenizer" || t == "GPTSentencePieceTokenizer" || t == "Llama2Tokenizer";
  if (file_based && cfg.data.tokenizer_model && std::filesystem::exists(*cfg.data.tokenizer_model)) {
    return make_tokenizer(cfg)->vocab_size();
  }
  return 0;
}

Config setup_config(CLI::App& app, ConfigCli& cli, int argc, char** argv, int64_t world_size, Purpose purpose,
                    bool announce) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    std::exit(app.exit(e));
  } catch (const CLI::ParseError& e) {
    throw ConfigError(std::string(e.what()) + " (megatrain --help lists all flags)");
  }
  Config cfg = cli.build();
  if (cfg.checkpoint.use_checkpoint_args && cfg.checkpoint.load) {
    // The model's shape comes from the checkpoint (Megatron's --use-checkpoint-args).
    Config saved;
    apply_yaml_text(saved, checkpoint_config_yaml(*cfg.checkpoint.load, cfg.checkpoint.ckpt_step), "checkpoint config");
    for (const auto& spec : flag_table()) {
      // (and the embedding's rows as saved: --padded-vocab-size, --no-pad-vocab-size, as Megatron restores padded_vocab_size)
      const bool rows = spec.name == "padded-vocab-size" || spec.name == "no-pad-vocab-size";
      if ((spec.group != "Network size" && !rows) || flag_is_list(spec)) continue;
      const std::string v = flag_value_text(saved, spec);
      if (v.empty()) unset_flag(cfg, spec, "checkpoint");
      else set_flag_from_string(cfg, spec, v, "checkpoint");
    }
    cfg.notes.push_back("note: model arguments taken from the checkpoint in " + *cfg.checkpoint.load + " (--use-checkpoint-args)");
  }
  // Megatron's older commands give the GPT-2 files without a tokenizer type: what they mean.
  if (!cfg.data.tokenizer_type && cfg.data.vocab_file && cfg.data.merge_file) {
    cfg.data.tokenizer_type = "GPT2BPETokenizer";
    cfg.notes.push_back("note: --vocab-file and --merge-file without --tokenizer-type: using GPT2BPETokenizer");
  }
  // A plan can assume what a command leaves to its batch settings (training still requires them).
  if (purpose == Purpose::kPlan && !cfg.training.micro_batch_size) {
    cfg.training.micro_batch_size = 1;
    cfg.notes.push_back("note: the plan assumes --micro-batch-size 1 (training needs it given)");
  }
  if (purpose == Purpose::kPlan && !cfg.training.global_batch_size && cfg.training.rampup_batch_size.empty() &&
      !cfg.training.step_batch_size_schedule) {
    cfg.notes.push_back("note: the plan assumes --global-batch-size = micro batch x data-parallel size (Megatron's default)");
  }
  if (cfg.checkpoint.no_save_rng || cfg.checkpoint.no_load_rng) {
    cfg.notes.push_back("note: --no-save-rng / --no-load-rng change nothing: megatrain's random numbers are a function of "
                        "(seed, iteration, sample), there is no RNG state in a checkpoint");
  }
  if (cli.print_config() && purpose == Purpose::kTrain) {
    // Printing needs no data or schedule; without a launcher, assume the smallest world the layout allows.
    purpose = Purpose::kPrint;
    if (world_size == 1) {
      const auto& p = cfg.parallel;
      const int64_t dense = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size;
      const int64_t expert = p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size) *
                             p.expert_model_parallel_size * p.pipeline_model_parallel_size;
      if (dense > 0 && expert > 0) world_size = std::lcm(dense, expert);
    }
  }
  Diagnostics d = validate(cfg, world_size, purpose);
  if (announce) {
    for (const auto& n : cfg.notes) std::cerr << "megatrain: " << n << "\n";
    for (const auto& w : d.warnings) std::cerr << "megatrain: warning: " << w << "\n";
  }
  if (!d.ok()) throw ConfigErrors(d.errors);
  resolve(cfg, world_size, known_tokenizer_vocab(cfg));
  if (const Diagnostics v = validate_vocabulary(cfg); !v.ok()) throw ConfigErrors(v.errors);
  // A plan under a step schedule: the batch it ends at, as Megatron's calculator takes its last entry (training sets
  // each iteration's from the schedule; Megatron's own global_batch_size is then micro batch x DP).
  if (purpose == Purpose::kPlan && cfg.training.step_batch_size_schedule) {
    const std::vector<BatchStep> steps = parse_batch_steps(*cfg.training.step_batch_size_schedule, cfg.data.seq_length.value_or(0));
    auto& dv = cfg.derived;
    dv.global_batch_size = steps.back().batch;
    dv.num_microbatches = std::max<int64_t>(1, dv.global_batch_size / (*cfg.training.micro_batch_size * dv.data_parallel_size));
    if (announce) std::cerr << "megatrain: note: the plan takes the step schedule's last global batch size, " << dv.global_batch_size << "\n";
  }
  // A resume loads the scheduler's state (not with --finetune, --no-load-optim or upcycling, as Megatron): the
  // checkpoint's schedule against this command's, once it has stepped (an iteration-0 checkpoint, such as an upcycled
  // model saved alone with --train-iters 0, has no schedule under way to keep).
  const auto& ck = cfg.checkpoint;
  if (purpose == Purpose::kTrain && ck.load && !ck.finetune && !ck.no_load_optim && !cfg.moe.moe_use_upcycling &&
      (ck.ckpt_step || latest_checkpoint(*ck.load))) {
    const CheckpointInfo info = checkpoint_info(*ck.load, ck.ckpt_step);
    // (without optimizer state the loader names --no-load-optim; an older checkpoint keeps no schedule to compare)
    if (!info.lr_schedule_json.empty() && info.iteration > 0 && info.has_optimizer) {
      const std::string note = reconcile_lr_schedule(cfg, info.lr_schedule_json, info.dir);
      if (!note.empty() && announce) std::cerr << "megatrain: note: " << note << "\n";
    } else if (info.lr_schedule_json.empty() && ck.use_checkpoint_opt_param_scheduler && announce) {
      std::cerr << "megatrain: note: --use-checkpoint-opt_param-scheduler: " << info.dir
                << " keeps no learning-rate schedule (saved before megatrain kept one): the command's is used\n";
    }
  }
  return cfg;
}

}  // namespace mt
