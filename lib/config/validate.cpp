// validate.cpp: every rule, every violation reported, each naming its numbers and a fix.
#include "config/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

#include "config/batch_steps.h"
#include "config/errors.h"
#include "config/attention_window.h"
#include "config/layer_pattern.h"
#include "config/moe_pattern.h"
#include "config/pipeline_layout.h"
#include "config/resolve.h"

namespace mt {
namespace {

std::string s(int64_t v) { return std::to_string(v); }
std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// Whether the stages are interleaved (virtual stages per rank by any of Megatron's three flags; a layout that does not
// parse counts as not: its own check reports it).
bool interleaving(const Config& c) {
  const auto& p = c.parallel;
  if (p.pipeline_model_parallel_layout) {
    try {
      return static_cast<int64_t>(parse_pipeline_layout(*p.pipeline_model_parallel_layout).size()) > p.pipeline_model_parallel_size;
    } catch (const ConfigError&) {
      return false;
    }
  }
  return p.num_layers_per_virtual_pipeline_stage || p.num_virtual_stages_per_pipeline_rank.value_or(1) > 1;
}

class Checker {
 public:
  Diagnostics d;
  void error(const std::string& m) { d.errors.push_back(m); }
  void warn(const std::string& m) { d.warnings.push_back(m); }
};

void check_required(const Config& c, Purpose purpose, Checker& k) {
  auto need = [&](bool present, const char* flag, const char* example) {
    if (!present) k.error(std::string("--") + flag + " is required: add e.g. --" + flag + " " + example);
  };
  need(c.model.num_layers.has_value(), "num-layers", "12");
  need(c.model.hidden_size.has_value(), "hidden-size", "768");
  need(c.model.num_attention_heads.has_value(), "num-attention-heads", "12");
  if (purpose == Purpose::kPrint) return;
  need(c.training.micro_batch_size.has_value(), "micro-batch-size", "4");
  need(c.data.seq_length.has_value(), "seq-length", "1024");
  if (c.model.position_embedding_type == "learned_absolute") {
    need(c.model.max_position_embeddings.has_value(), "max-position-embeddings", "1024");
  }
  auto positive = [&](const OptInt& v, const char* flag) {
    if (v && *v <= 0) k.error(std::string("--") + flag + " must be positive, got " + s(*v));
  };
  positive(c.model.num_layers, "num-layers");
  positive(c.model.hidden_size, "hidden-size");
  positive(c.model.num_attention_heads, "num-attention-heads");
  positive(c.training.micro_batch_size, "micro-batch-size");
  positive(c.training.global_batch_size, "global-batch-size");
  positive(c.data.seq_length, "seq-length");
  positive(c.model.ffn_hidden_size, "ffn-hidden-size");
  positive(c.model.kv_channels, "kv-channels");
  // Sizes beyond any model: refused at once (the planner's and the engines' counts stay exact in 64 bits).
  auto at_most = [&](const OptInt& v, const char* flag, int64_t limit) {
    if (v && *v > limit) {
      k.error(std::string("--") + flag + " " + s(*v) + " is beyond any model that fits anywhere (megatrain plans up to " + s(limit) +
              "): this model does not fit");
    }
  };
  at_most(c.model.num_layers, "num-layers", 100000);
  at_most(c.model.hidden_size, "hidden-size", int64_t{1} << 20);
  at_most(c.model.ffn_hidden_size, "ffn-hidden-size", int64_t{1} << 24);
  at_most(c.model.num_attention_heads, "num-attention-heads", int64_t{1} << 16);
  at_most(c.model.kv_channels, "kv-channels", int64_t{1} << 16);
  at_most(c.model.vocab_size, "vocab-size", (int64_t{1} << 31) - 1);  // token ids are 32-bit
  at_most(c.model.max_position_embeddings, "max-position-embeddings", int64_t{1} << 26);
  at_most(c.data.seq_length, "seq-length", int64_t{1} << 26);
  at_most(c.training.micro_batch_size, "micro-batch-size", int64_t{1} << 20);
  at_most(c.training.global_batch_size, "global-batch-size", int64_t{1} << 40);
  at_most(c.moe.num_experts, "num-experts", int64_t{1} << 16);
}

void check_parallel_sizes(const Config& c, int64_t world, Checker& k) {
  const auto& p = c.parallel;
  auto pos = [&](int64_t v, const char* flag) {
    if (v < 1) k.error(std::string("--") + flag + " must be >= 1, got " + s(v));
    return v >= 1;
  };
  bool ok = pos(p.tensor_model_parallel_size, "tensor-model-parallel-size") &
            pos(p.pipeline_model_parallel_size, "pipeline-model-parallel-size") &
            pos(p.context_parallel_size, "context-parallel-size") &
            pos(p.expert_model_parallel_size, "expert-model-parallel-size");
  if (p.expert_tensor_parallel_size) ok &= pos(*p.expert_tensor_parallel_size, "expert-tensor-parallel-size");
  if (!ok) return;
  const int64_t tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size, cp = p.context_parallel_size;
  const int64_t ep = p.expert_model_parallel_size, etp = p.expert_tensor_parallel_size.value_or(tp);
  const int64_t mp = tp * pp * cp;
  if (world % mp != 0) {
    std::ostringstream m;
    m << "world size " << world << " is not divisible by TP(" << tp << ") x PP(" << pp << ") x CP(" << cp
      << ") = " << mp << ": use a world size that is a multiple of " << mp << " or change TP/PP/CP";
    k.error(m.str());
  }
  const int64_t ex = etp * ep * pp;
  // Without experts the expert grid is the dense one minus CP: report it only when it says something new.
  const bool expert_grid_differs = ep > 1 || etp != tp || world % mp == 0;
  if (world % ex != 0 && expert_grid_differs) {
    std::ostringstream m;
    m << "world size " << world << " is not divisible by the expert grid ETP(" << etp << ") x EP(" << ep << ") x PP("
      << pp << ") = " << ex << ": change --expert-model-parallel-size or --expert-tensor-parallel-size";
    k.error(m.str());
  } else if (world % mp == 0 && pp > 1 && c.parallel.use_tp_pp_dp_mapping && world / ex != world / mp) {
    k.error("with --use-tp-pp-dp-mapping the expert data-parallel size (" + s(world / ex) +
            ") must equal the dense one (" + s(world / mp) + "): drop --use-tp-pp-dp-mapping or make ETP x EP = TP x CP");
  }
  if (ep > 1 && !c.moe.num_experts) {
    k.error("--expert-model-parallel-size " + s(ep) + " needs an MoE model: add --num-experts (a multiple of " + s(ep) + ")");
  }
  if (c.moe.num_experts) {
    const int64_t ne = *c.moe.num_experts;
    if (ne < 1) k.error("--num-experts must be >= 1, got " + s(ne));
    else if (ne % ep != 0) {
      k.error("--num-experts " + s(ne) + " is not divisible by EP(" + s(ep) + "): use a number of experts that is a multiple of " +
              s(ep) + " or change --expert-model-parallel-size");
    }
    if (c.moe.moe_router_topk < 1 || c.moe.moe_router_topk > ne) {
      k.error("--moe-router-topk " + s(c.moe.moe_router_topk) + " must be between 1 and --num-experts " + s(ne));
    }
  }
}

void check_pipeline(const Config& c, Checker& k) {
  const auto& p = c.parallel;
  const int64_t pp = p.pipeline_model_parallel_size;
  if (!c.model.num_layers || pp < 1) return;
  const int64_t L = *c.model.num_layers;
  const auto& first = p.decoder_first_pipeline_num_layers;
  const auto& last = p.decoder_last_pipeline_num_layers;
  const bool uneven = first || last;
  const int64_t account = (p.account_for_embedding_in_pipeline_split ? 1 : 0) + (p.account_for_loss_in_pipeline_split ? 1 : 0);
  if (account && uneven) {
    k.error("--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split cannot be combined with "
            "--decoder-first/last-pipeline-num-layers: give the stage sizes one way");
  }
  int64_t vpp = 0;
  if (p.num_layers_per_virtual_pipeline_stage && p.num_virtual_stages_per_pipeline_rank) {
    k.error("give only one of --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank");
  }
  if (p.pipeline_model_parallel_layout) {  // (Megatron's rules: the layout alone sets the stages)
    if (p.num_layers_per_virtual_pipeline_stage || p.num_virtual_stages_per_pipeline_rank) {
      k.error("--pipeline-model-parallel-layout sets the virtual stages itself: drop --num-layers-per-virtual-pipeline-stage / "
              "--num-virtual-stages-per-pipeline-rank (Megatron allows one of the three)");
    }
    if (uneven || account) {
      k.error("--pipeline-model-parallel-layout cannot be combined with --decoder-first/last-pipeline-num-layers or --account-for-embedding/"
              "loss-in-pipeline-split (as Megatron): give the stages one way");
    }
    try {
      const std::vector<PipelineLayoutStage> stages = parse_pipeline_layout(*p.pipeline_model_parallel_layout);
      std::string problems = pipeline_layout_problems(stages, pp, L, c.model.mtp_num_layers.value_or(0));
      for (size_t at = 0; !problems.empty();) {
        const size_t nl = problems.find('\n', at);
        k.error(problems.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
        if (nl == std::string::npos) break;
        at = nl + 1;
      }
      if (static_cast<int64_t>(stages.size()) % pp == 0) vpp = static_cast<int64_t>(stages.size()) / pp;
    } catch (const ConfigError& e) {
      k.error(e.what());
    }
    if (vpp > 1 && pp < 2) k.error("interleaved pipelining (" + s(vpp) + " virtual stages) needs --pipeline-model-parallel-size > 1");
    if (p.pipeline_schedule == "zb-h1" && vpp > 1) {
      k.error("--pipeline-schedule zb-h1 has no interleaved form here: give the layout PP stages or use --pipeline-schedule 1f1b");
    }
    return;  // (the rest checks the even and uneven splits)
  }
  if (uneven) {
    if (p.num_layers_per_virtual_pipeline_stage) {
      k.error("--decoder-first/last-pipeline-num-layers cannot be combined with --num-layers-per-virtual-pipeline-stage: "
              "use --num-virtual-stages-per-pipeline-rank");
    }
    if (pp == 1) k.error("--decoder-first/last-pipeline-num-layers need pipeline parallelism (PP is 1)");
    int64_t remaining = L, middle = pp;
    for (const auto* v : {&first, &last}) {
      if (!*v) continue;
      if (**v <= 0) k.error("uneven pipeline stage sizes must be positive, got " + s(**v));
      remaining -= **v;
      --middle;
    }
    if (remaining < 0) {
      k.error("first/last pipeline stages hold more layers (" + s(L - remaining) + ") than --num-layers " + s(L));
    } else if ((remaining > 0) != (middle > 0)) {
      k.error(middle > 0 ? "no layers left for the " + s(middle) + " middle pipeline stage(s): lower the first/last stage sizes"
                         : s(remaining) + " layers left over after the first and last stages with no middle stages: "
                               "first + last must equal --num-layers " + s(L));
    } else if (middle > 0 && remaining % middle != 0) {
      k.error("the " + s(remaining) + " layers between the first and last pipeline stages do not divide over the " + s(middle) +
              " middle stages: choose first/last sizes leaving a multiple of " + s(middle));
    }
  } else if (account) {
    if (L + account < pp) k.error("--num-layers " + s(L) + " with the embedding / loss counted leaves a pipeline stage empty of everything at PP(" + s(pp) + ")");
  } else if (L % pp != 0) {
    k.error("--num-layers " + s(L) + " is not divisible by PP(" + s(pp) +
            "): use a multiple of " + s(pp) + " layers or set --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers");
  }
  if (p.num_layers_per_virtual_pipeline_stage) {
    const int64_t lv = *p.num_layers_per_virtual_pipeline_stage;
    if (lv < 1) {
      k.error("--num-layers-per-virtual-pipeline-stage must be >= 1, got " + s(lv));
    } else if (L % pp == 0 && (L / pp) % lv != 0) {
      k.error("layers per pipeline stage (" + s(L) + "/" + s(pp) + " = " + s(L / pp) +
              ") is not divisible by --num-layers-per-virtual-pipeline-stage " + s(lv));
    } else if (L % pp == 0) {
      vpp = (L / pp) / lv;
    }
  }
  if (p.num_virtual_stages_per_pipeline_rank) {
    vpp = *p.num_virtual_stages_per_pipeline_rank;
    if (vpp < 1) k.error("--num-virtual-stages-per-pipeline-rank must be >= 1, got " + s(vpp));
    if (!uneven && !account && vpp >= 1 && L % pp == 0 && (L / pp) % vpp != 0) {
      k.error("layers per pipeline stage (" + s(L / pp) + ") is not divisible by --num-virtual-stages-per-pipeline-rank " + s(vpp));
    }
    if (uneven && vpp >= 1) {
      for (const auto* v : {&first, &last}) {
        if (*v && **v % vpp != 0) k.error("uneven stage size " + s(**v) + " is not divisible by the virtual stages " + s(vpp));
      }
    }
  }
  if (vpp > 1 && pp < 2) {
    k.error("interleaved pipelining (" + s(vpp) + " virtual stages) needs --pipeline-model-parallel-size > 1");
  }
  if (account && !uneven && (L + account) % (pp * std::max<int64_t>(1, vpp)) != 0) {
    k.error("--num-layers " + s(L) + " plus the " + s(account) + " counted for the embedding / loss (" + s(L + account) +
            ") is not divisible by the " + s(pp * std::max<int64_t>(1, vpp)) + " (virtual) pipeline stages: change --num-layers");
  }
  if (p.pipeline_schedule == "zb-h1" && vpp > 1) {
    k.error("--pipeline-schedule zb-h1 has no interleaved form here: drop the virtual pipeline stages or use --pipeline-schedule 1f1b");
  }
}

void check_attention(const Config& c, Checker& k) {
  const auto& m = c.model;
  const int64_t tp = c.parallel.tensor_model_parallel_size;
  if (!m.num_attention_heads || !m.hidden_size || tp < 1) return;
  const int64_t n = *m.num_attention_heads, h = *m.hidden_size;
  if (n < 1 || h < 1) return;
  if (n % tp != 0) {
    k.error("--num-attention-heads " + s(n) + " is not divisible by TP(" + s(tp) + "): use a TP that divides " + s(n));
  }
  if (!m.kv_channels && h % n != 0) {
    k.error("--hidden-size " + s(h) + " is not divisible by --num-attention-heads " + s(n) + ": fix one or give --kv-channels");
  }
  if (m.group_query_attention) {
    const int64_t g = m.num_query_groups;
    if (g < 1) {
      k.error("--num-query-groups must be >= 1, got " + s(g));
    } else {
      if (n % g != 0) k.error("--num-attention-heads " + s(n) + " is not divisible by --num-query-groups " + s(g));
      if (g % tp != 0 && tp % g != 0) {
        k.error("--num-query-groups " + s(g) + " and TP(" + s(tp) + ") must divide one another: use TP " +
                (g > tp ? "dividing " : "a multiple of ") + s(g));
      }
    }
  }
  const int64_t ffn = m.ffn_hidden_size.value_or(default_ffn_hidden_size(h, m.swiglu));
  if (ffn % tp != 0) {
    k.error("--ffn-hidden-size " + s(ffn) + " is not divisible by TP(" + s(tp) + "): use a multiple of " + s(tp));
  }
  if (m.make_vocab_size_divisible_by < 1) {
    k.error("--make-vocab-size-divisible-by must be >= 1, got " + s(m.make_vocab_size_divisible_by));
  }
  if (m.padded_vocab_size && *m.padded_vocab_size < 1) k.error("--padded-vocab-size must be >= 1, got " + s(*m.padded_vocab_size));
  const auto& d = c.data;
  if (c.training.apply_wd_to_qk_layernorm && !m.qk_layernorm) {
    k.warn("--apply-wd-to-qk-layernorm has no effect without --qk-layernorm (no QK norms to decay)");
  }
  if (c.precision.ddp_reduce_scatter_with_fp32_accumulation && c.precision.grad_reduce_in_bf16) {
    k.error("--ddp-reduce-scatter-with-fp32-accumulation with --grad-reduce-in-bf16: megatrain's bf16 reductions sum in bf16 (bf16 on the wire "
            "with fp32 sums is not implemented): drop one of them");
  }
  if (d.vocab_extra_ids != 0) k.error("--vocab-extra-ids: T5's sentinel tokens have no place in megatrain's decoder-only models: drop it");
  const bool null_tokenizer = d.tokenizer_type.value_or("") == "NullTokenizer";
  if ((d.null_tokenizer_eod_id || d.null_tokenizer_pad_id != -1) && !null_tokenizer) {
    k.error(std::string(d.null_tokenizer_eod_id ? "--null-tokenizer-eod-id" : "--null-tokenizer-pad-id") +
            " applies to --tokenizer-type NullTokenizer: add it, or drop the flag");
  }
  if (null_tokenizer && m.vocab_size) {  // (NullTokenizer's ids: 0 to --vocab-size, the last its default end of document)
    if (d.null_tokenizer_eod_id && (*d.null_tokenizer_eod_id < 0 || *d.null_tokenizer_eod_id > *m.vocab_size)) {
      k.error("--null-tokenizer-eod-id " + s(*d.null_tokenizer_eod_id) + " is not an id of NullTokenizer's 0 to " + s(*m.vocab_size));
    }
    if (d.null_tokenizer_pad_id < -1 || d.null_tokenizer_pad_id > *m.vocab_size) {
      k.error("--null-tokenizer-pad-id " + s(d.null_tokenizer_pad_id) + " is not -1 (none) or an id of NullTokenizer's 0 to " + s(*m.vocab_size));
    }
  }
  if (m.use_rope_scaling && (!std::isfinite(m.rope_scaling_factor) || m.rope_scaling_factor < 1)) {
    k.error("--rope-scaling-factor must be a finite number >= 1, got " + num(m.rope_scaling_factor));
  }
  if (m.use_rope_scaling && m.position_embedding_type != "rope") k.error("--use-rope-scaling needs --position-embedding-type rope");
  if (m.window_size) {  // sliding-window attention (config/attention_window.h)
    try {
      const AttentionWindowSize w = parse_window_size(*m.window_size);
      if (w.right != 0) {
        k.error("--window-size " + *m.window_size + ": the window's right bound must be 0 (megatrain's models are causal: a token sees no later "
                "one): give LEFT,0");
      }
      if (c.model.num_layers) (void)attention_windows(c);
    } catch (const ConfigError& e) {
      k.error(e.what());
    }
  } else if (m.window_attn_skip_freq) {
    k.warn("--window-attn-skip-freq without --window-size: no layer has a window (as in Megatron)");
  }
  if (rope_skipping_given(c)) {
    if (m.position_embedding_type != "rope" && m.position_embedding_type != "yarn") {
      k.error("--no-rope-freq picks the layers without RoPE: it needs --position-embedding-type rope (or yarn)");
    }
    try {
      if (c.model.num_layers) (void)rope_skipped_layers(c);
    } catch (const ConfigError& e) {
      k.error(e.what());
    }
  }
  if (const auto& f = m.rotary_seq_len_interpolation_factor) {
    if (*f < 1) k.error("--rotary-seq-len-interpolation-factor must be >= 1 (positions are divided by it), got " + s(*f));
    if (m.position_embedding_type != "rope") k.error("--rotary-seq-len-interpolation-factor needs --position-embedding-type rope");
  }
  if (m.no_position_embedding && m.position_embedding_type != "rope") {  // (Megatron raises the same)
    k.error("--no-position-embedding is deprecated and works only with --position-embedding-type rope: use --position-embedding-type none or rope");
  }
  if (m.rotary_percent <= 0 || m.rotary_percent > 1) {
    k.error("--rotary-percent must be in (0, 1], got " + std::to_string(m.rotary_percent));
  }
  for (auto [v, flag] : {std::pair{m.hidden_dropout, "hidden-dropout"}, std::pair{m.attention_dropout, "attention-dropout"}}) {
    if (v < 0 || v >= 1) k.error(std::string("--") + flag + " must be in [0, 1), got " + std::to_string(v));
  }
}

// --rampup-batch-size <start> <increment> <samples> (Megatron's rules; every batch size on the way a
// multiple of micro batch x DP, so each iteration has whole microbatches).
void check_rampup(const Config& c, int64_t dp, Checker& k) {
  const auto& r = c.training.rampup_batch_size;
  if (r.empty()) return;
  if (r.size() != 3) {
    k.error("--rampup-batch-size takes 3 values <start> <increment> <samples>, got " + s(int64_t(r.size())));
    return;
  }
  int64_t v[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    try {
      size_t used = 0;
      v[i] = std::stoll(r[static_cast<size_t>(i)], &used);
      if (used != r[static_cast<size_t>(i)].size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      k.error("--rampup-batch-size takes 3 integers <start> <increment> <samples>, got '" + r[static_cast<size_t>(i)] + "'");
      return;
    }
  }
  const int64_t start = v[0], inc = v[1], samples = v[2];
  if (start <= 0 || inc <= 0 || samples <= 0) {
    k.error("--rampup-batch-size needs a positive start, increment and sample count, got " + s(start) + " " + s(inc) + " " + s(samples));
    return;
  }
  if (!c.training.global_batch_size) k.error("--rampup-batch-size needs --global-batch-size (the size the ramp ends at)");
  if (c.training.train_iters) {
    k.error("--rampup-batch-size needs --train-samples (as in Megatron: no batch-size ramp-up for iteration-based training)");
  }
  const auto& t = c.training;
  if (t.lr_decay_iters || t.lr_warmup_iters > 0) {
    k.error("--rampup-batch-size counts the schedule in samples: use --lr-decay-samples / --lr-warmup-samples instead of the -iters forms");
  }
  if (t.lr_decay_style == "WSD") k.error("--rampup-batch-size with --lr-decay-style WSD is not implemented (no sample-based WSD decay yet)");
  if (c.training.global_batch_size) {
    const int64_t gbs = *c.training.global_batch_size;
    if (start > gbs || (gbs - start) % inc != 0) {
      k.error("--rampup-batch-size: --global-batch-size " + s(gbs) + " must be the start " + s(start) + " plus a whole number of increments of " +
              s(inc));
    }
  }
  if (c.training.micro_batch_size && *c.training.micro_batch_size > 0) {
    const int64_t unit = *c.training.micro_batch_size * dp;
    const auto& p = c.parallel;
    const bool interleaved = p.pipeline_model_parallel_size > 1 && interleaving(c);
    if (interleaved && (start % (unit * p.pipeline_model_parallel_size) != 0 || inc % (unit * p.pipeline_model_parallel_size) != 0)) {
      k.error("--rampup-batch-size with interleaved pipelining: the start " + s(start) + " and increment " + s(inc) + " must be multiples of " +
              "micro-batch-size x DP x PP = " + s(unit * p.pipeline_model_parallel_size) + " (every batch on the way in microbatches a multiple of PP)");
    }
    if (start % unit != 0 || inc % unit != 0) {
      k.error("--rampup-batch-size: the start " + s(start) + " and increment " + s(inc) + " must be multiples of micro-batch-size x DP = " + s(unit) +
              " (every batch size on the way is split into whole microbatches)");
    }
  }
}

// --step-batch-size-schedule (Megatron's rules: its parse, and not with --global-batch-size). Each batch size's division
// into whole microbatches is checked where the run starts, from the batch in effect there on (BatchSchedule::check_from),
// as Megatron checks the current one: a resumed run on more GPUs may have passed entries it could not split.
void check_step_batch_schedule(const Config& c, Checker& k) {
  const auto& t = c.training;
  if (!t.step_batch_size_schedule) return;
  try {
    parse_batch_steps(*t.step_batch_size_schedule, c.data.seq_length.value_or(0));
  } catch (const std::invalid_argument& e) {
    k.error("--step-batch-size-schedule: " + std::string(e.what()));
  }
  if (t.global_batch_size) {
    k.error("Cannot specify both --step-batch-size-schedule and --global-batch-size (as Megatron): drop --global-batch-size, the schedule sets "
            "each iteration's");
  }
  if (!t.rampup_batch_size.empty()) {
    k.error("--step-batch-size-schedule with --rampup-batch-size: give one of them (Megatron deprecates --rampup-batch-size for the schedule)");
  }
  const auto& p = c.parallel;
  const bool interleaved = p.pipeline_model_parallel_size > 1 && interleaving(c);
  if (interleaved && c.logging.eval_iters > 0 && !t.eval_global_batch_size) {
    k.error("--step-batch-size-schedule with interleaved pipelining: evaluation takes micro-batch x DP samples (Megatron's global batch "
            "beside a schedule), one microbatch, which the interleaved schedule cannot split over the stages: give --eval-global-batch-size "
            "(a multiple of micro-batch x DP x PP), set --eval-iters 0, or drop the virtual stages");
  }
  if (t.train_iters || t.lr_decay_iters || t.lr_warmup_iters > 0) {
    k.warn("--step-batch-size-schedule with --train-iters / --lr-decay-iters / --lr-warmup-iters: as in Megatron the learning-rate schedule "
           "counts an iteration as micro-batch x DP samples, not the schedule's batch; --train-samples with --lr-decay-samples / "
           "--lr-warmup-samples follow the samples");
  }
}

// Interleaved pipelining's rule for `nmb` microbatches of `what` (Megatron's, checked where its schedule runs): groups of
// --microbatch-group-size-per-virtual-pipeline-stage (default PP) microbatches, the group in [PP, microbatches], the last
// group none or at least PP. "" when they fit (or without interleaving).
std::string interleaved_microbatch_problem(const Config& c, int64_t nmb, const std::string& what, const std::string& fix) {
  const auto& p = c.parallel;
  const bool vpp = interleaving(c);
  const int64_t pp = p.pipeline_model_parallel_size;
  if (!vpp || pp <= 1) return "";
  if (!p.microbatch_group_size_per_vp_stage) {
    if (nmb % pp == 0) return "";
    return "interleaved pipelining needs the number of " + what + " (" + s(nmb) + ") divisible by PP(" + s(pp) + "): " + fix;
  }
  const int64_t g = *p.microbatch_group_size_per_vp_stage;
  if (g > nmb) {
    return "--microbatch-group-size-per-virtual-pipeline-stage " + s(g) + " is more than the " + what + " (" + s(nmb) + "; Megatron's range is [PP, " +
           "microbatches]): lower it, or " + fix;
  }
  if (nmb % g != 0 && nmb % g < pp) {
    return "the " + what + " (" + s(nmb) + ") leave a last group of " + s(nmb % g) + " with --microbatch-group-size-per-virtual-pipeline-stage " +
           s(g) + ", fewer than PP(" + s(pp) + ") (Megatron: a dependency bubble): " + fix + ", or change the group size";
  }
  return "";
}

void check_batch_and_sequence(const Config& c, int64_t world, Checker& k) {
  const auto& p = c.parallel;
  const int64_t mp = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size;
  if (mp < 1 || world % mp != 0) return;
  const int64_t dp = world / mp;
  if (const int64_t n = c.training.num_distributed_optimizer_instances; n > 1 && (dp * p.context_parallel_size) % n != 0) {
    k.error("DP x CP (" + s(dp * p.context_parallel_size) + ") is not divisible by --num-distributed-optimizer-instances " + s(n) +
            " (Megatron: each instance a whole slice of the data-parallel ranks): change it or the world size");
  } else if (n > 1 && c.moe.num_experts) {  // (the experts' data-parallel group too, as Megatron's)
    const int64_t expert_grid = p.expert_tensor_parallel_size.value_or(p.tensor_model_parallel_size) * p.expert_model_parallel_size *
                                p.pipeline_model_parallel_size;
    if (expert_grid > 0 && world % expert_grid == 0 && (world / expert_grid) % n != 0) {
      k.error("the experts' data-parallel size (" + s(world / expert_grid) + ") is not divisible by --num-distributed-optimizer-instances " + s(n) +
              ": change it, the world size or EP");
    }
  }
  if (c.training.micro_batch_size && *c.training.micro_batch_size > 0 && !c.training.step_batch_size_schedule) {
    // (without --global-batch-size: one microbatch per DP rank, Megatron's default)
    const int64_t mbs = *c.training.micro_batch_size, gbs = c.training.global_batch_size.value_or(mbs * dp);
    if (gbs % (mbs * dp) != 0) {
      k.error("--global-batch-size " + s(gbs) + " is not divisible by micro-batch-size(" + s(mbs) + ") x DP(" + s(dp) +
              ") = " + s(mbs * dp) + ": use a multiple of " + s(mbs * dp));
    } else {
      const int64_t nmb = gbs / (mbs * dp);
      if (std::string why = interleaved_microbatch_problem(c, nmb, "microbatches", "change --global-batch-size"); !why.empty()) k.error(why);
    }
  }
  check_rampup(c, dp, k);
  check_step_batch_schedule(c, k);
  // Evaluation's batch (Megatron's --eval-global-batch-size / --eval-micro-batch-size, training's by default): whole
  // microbatches on every DP rank, a multiple of PP of them when interleaved.
  const auto& t = c.training;
  if (t.eval_micro_batch_size && *t.eval_micro_batch_size <= 0) k.error("--eval-micro-batch-size must be positive, got " + s(*t.eval_micro_batch_size));
  if (t.eval_global_batch_size && *t.eval_global_batch_size <= 0) k.error("--eval-global-batch-size must be positive, got " + s(*t.eval_global_batch_size));
  if ((t.eval_micro_batch_size || t.eval_global_batch_size) && t.micro_batch_size && *t.micro_batch_size > 0 &&
      t.eval_micro_batch_size.value_or(1) > 0 && t.eval_global_batch_size.value_or(1) > 0) {
    const int64_t emb = t.eval_micro_batch_size.value_or(*t.micro_batch_size);
    const int64_t egb = t.eval_global_batch_size.value_or(t.global_batch_size.value_or(*t.micro_batch_size * dp));
    if (egb % (emb * dp) != 0) {
      k.error("the evaluation's global batch " + s(egb) + " is not divisible by its micro-batch-size(" + s(emb) + ") x DP(" + s(dp) + ") = " +
              s(emb * dp) + " (as Megatron asks): change --eval-global-batch-size or --eval-micro-batch-size");
    } else if (c.logging.eval_iters > 0) {
      if (std::string why = interleaved_microbatch_problem(c, egb / (emb * dp), "evaluation's microbatches", "change --eval-global-batch-size");
          !why.empty()) {
        k.error(why);
      }
    }
  }
  if (const auto& g = p.microbatch_group_size_per_vp_stage; g) {
    const bool vpp = interleaving(c);
    if (vpp && *g < p.pipeline_model_parallel_size) {  // (Megatron checks it where the interleaved schedule runs only)
      k.error("--microbatch-group-size-per-virtual-pipeline-stage " + s(*g) + " is less than PP(" + s(p.pipeline_model_parallel_size) +
              ") (Megatron's range is [PP, microbatches]): raise it");
    }
    if (vpp && (!t.rampup_batch_size.empty() || t.step_batch_size_schedule)) {
      k.error("--microbatch-group-size-per-virtual-pipeline-stage with a changing batch (--rampup-batch-size, --step-batch-size-schedule) is not "
              "implemented: drop one of them");
    }
  }
  if (c.data.seq_length) {
    const int64_t seq = *c.data.seq_length, cp = p.context_parallel_size;
    if (cp > 1 && p.cp_comm_type == "a2a" && c.model.num_attention_heads) {
      const int64_t tp = p.tensor_model_parallel_size, heads = *c.model.num_attention_heads / std::max<int64_t>(1, tp);
      const int64_t groups = std::max<int64_t>(1, effective_query_groups(c) / std::max<int64_t>(1, tp));
      if (heads % cp != 0 || groups % cp != 0) {
        k.error("--cp-comm-type a2a needs each TP rank's attention heads (" + s(heads) + ") and query groups (" + s(groups) +
                ") divisible by CP(" + s(cp) + "): use --cp-comm-type p2p, or change the heads / groups / TP");
      }
    }
    const int64_t tp = p.tensor_model_parallel_size, mbs = c.training.micro_batch_size.value_or(1);
    if (cp > 1 && p.sequence_parallel && tp > 1 && seq % cp == 0 && (mbs * (seq / cp)) % tp != 0) {
      k.error("with --context-parallel-size " + s(cp) + " each rank holds " + s(mbs * (seq / cp)) + " tokens of a microbatch, which sequence "
              "parallelism cannot split over TP(" + s(tp) + "): change --seq-length or --micro-batch-size");
    }
    if (cp > 1 && seq % (2 * cp) != 0) {
      k.error("--seq-length " + s(seq) + " is not divisible by 2 x CP(" + s(cp) + ") = " + s(2 * cp) +
              ": use a multiple of " + s(2 * cp));
    }
    if (c.model.max_position_embeddings && *c.model.max_position_embeddings < seq) {
      k.error("--max-position-embeddings " + s(*c.model.max_position_embeddings) + " is smaller than --seq-length " + s(seq) +
              ": raise it to at least " + s(seq));
    }
  }
}

// Megatron's precision-aware optimizer (its rules: the storage types other than fp32 only with the flag, the flag only with
// the distributed optimizer and Adam). megatrain stores the moments in fp32 or bf16; the other types are refused by name.
void check_precision_aware_optimizer(const Config& c, Checker& k) {
  const auto& t = c.training;
  const std::pair<const char*, const std::string*> types[] = {{"main-grads-dtype", &t.main_grads_dtype},
                                                              {"main-params-dtype", &t.main_params_dtype},
                                                              {"exp-avg-dtype", &t.exp_avg_dtype},
                                                              {"exp-avg-sq-dtype", &t.exp_avg_sq_dtype}};
  for (const auto& [flag, type] : types) {
    if (*type == "fp32") continue;
    if (*type != "bf16" || std::string(flag) == "main-grads-dtype") {
      const std::string what = std::string(flag) == "main-grads-dtype" ? "gradients kept in bf16"
                               : std::string(flag) == "main-params-dtype" ? "fp16 master weights"
                                                                            : "Adam's moments in " + *type + " (Transformer Engine's scaled storage)";
      k.error("--" + std::string(flag) + " " + *type + ": " + what + " not implemented (fp32" +
              (std::string(flag).rfind("exp-avg", 0) == 0 ? " or bf16" : "") + " only): change it");
    } else if (!t.use_precision_aware_optimizer) {
      k.error(std::string("--") + flag + " " + *type + " needs --use-precision-aware-optimizer (Megatron's rule): add it, or drop --" + flag);
    } else if (t.optimizer_cpu_offload) {
      k.warn(std::string("--") + flag + " " + *type + " with --optimizer-cpu-offload: Megatron's hybrid CPU/GPU optimizer keeps Adam's "
             "moments in fp32, and so does megatrain");
    }
  }
  if (t.use_precision_aware_optimizer) {
    if (!t.use_distributed_optimizer) {
      k.error("--use-precision-aware-optimizer needs --use-distributed-optimizer (Megatron's rule): add it, or drop the flag");
    }
    if (t.optimizer != "adam") k.error("--use-precision-aware-optimizer works with --optimizer adam only (Megatron's rule), got " + t.optimizer);
  }
}

void check_exclusive_and_misc(const Config& c, Purpose purpose, Checker& k) {
  const auto& t = c.training;
  if (const int64_t n = t.num_distributed_optimizer_instances; n != 1) {
    if (n > 1 && c.precision.ddp_reduce_scatter_with_fp32_accumulation) {
      k.error("--ddp-reduce-scatter-with-fp32-accumulation with --num-distributed-optimizer-instances > 1 (Megatron refuses it): drop one of them");
    }
    if (n < 1) k.error("--num-distributed-optimizer-instances must be >= 1, got " + s(n));
    else if (!t.use_distributed_optimizer) k.error("--num-distributed-optimizer-instances " + s(n) + " needs --use-distributed-optimizer (the instances shard its state)");
  }
  check_precision_aware_optimizer(c, k);
  if (c.parallel.sequence_parallel && c.parallel.tensor_model_parallel_size == 1) {
    k.warn("--sequence-parallel has no effect without tensor parallelism (TP is 1): it is turned off");
  }
  if (c.precision.fp16 && c.precision.bf16) k.error("--fp16 and --bf16 are exclusive: pick one");
  if (t.overlap_param_gather && !(t.use_distributed_optimizer && t.overlap_grad_reduce)) {
    k.error("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce: add them or drop it");
  }
  if (c.checkpoint.override_opt_param_scheduler && c.checkpoint.use_checkpoint_opt_param_scheduler) {
    k.error("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler contradict each other (Megatron refuses both): keep one");
  }
  if (c.checkpoint.save && (!c.checkpoint.save_interval || *c.checkpoint.save_interval <= 0)) {
    k.error("--save needs --save-interval > 0" +
            (c.checkpoint.save_interval ? ", got " + s(*c.checkpoint.save_interval) : std::string(": add e.g. --save-interval 1000")));
  }
  if (const auto& retain = c.checkpoint.save_retain_interval; retain) {  // (Megatron's checks)
    if (*retain <= 0) {
      k.error("--save-retain-interval must be positive, got " + s(*retain));
    } else if (c.checkpoint.save_interval && *c.checkpoint.save_interval > 0 && *retain % *c.checkpoint.save_interval != 0) {
      k.error("--save-retain-interval " + s(*retain) + " is not a multiple of --save-interval " + s(*c.checkpoint.save_interval) +
              " (as Megatron requires): use a multiple, e.g. " + s((*retain + *c.checkpoint.save_interval - 1) / *c.checkpoint.save_interval * *c.checkpoint.save_interval));
    }
    if (c.checkpoint.ckpt_keep_last > 0) {
      k.error("--save-retain-interval and --ckpt-keep-last both choose which checkpoints to delete: give one");
    }
    if (!c.checkpoint.save) k.warn("--save-retain-interval has no effect without --save");
  }
  if (c.checkpoint.ckpt_keep_last < 0) k.error("--ckpt-keep-last must be 0 (keep all) or positive, got " + s(c.checkpoint.ckpt_keep_last));
  if (t.train_iters && t.train_samples) k.error("--train-iters and --train-samples are exclusive: give one");
  if (t.lr_warmup_fraction && t.lr_warmup_iters != 0) {
    k.error("--lr-warmup-fraction and --lr-warmup-iters are exclusive: give one");
  }
  if (t.lr_warmup_fraction && (*t.lr_warmup_fraction < 0 || *t.lr_warmup_fraction > 1)) {
    k.error("--lr-warmup-fraction must be in [0, 1], got " + std::to_string(*t.lr_warmup_fraction));
  }
  if (t.lr_decay_style == "WSD" && !t.lr_wsd_decay_iters && purpose == Purpose::kTrain) {
    k.error("--lr-decay-style WSD needs --lr-wsd-decay-iters (iterations of the final decay)");
  }
  const auto& r = c.recompute;
  if (r.recompute_method && r.recompute_granularity.value_or("") != "full") {
    k.error("--recompute-method " + *r.recompute_method + " needs --recompute-granularity full");
  }
  if (r.recompute_granularity.value_or("") == "full" && !r.recompute_method) {
    k.error("--recompute-granularity full needs --recompute-method uniform|block (and --recompute-num-layers)");
  }
  if (r.recompute_method && !r.recompute_num_layers) {
    k.error("--recompute-method " + *r.recompute_method + " needs --recompute-num-layers");
  }
  if (r.recompute_num_layers && *r.recompute_num_layers < 1) {
    k.error("--recompute-num-layers must be >= 1, got " + s(*r.recompute_num_layers));
  }
  // Selective recompute's modules (Megatron's TransformerConfig checks). --moe-layer-recompute adds "moe" (resolve()).
  if (r.moe_layer_recompute) {
    if (r.recompute_granularity.value_or("") == "full") k.error("--moe-layer-recompute with --recompute-granularity full: give one of them (as Megatron)");
    k.warn("--moe-layer-recompute is deprecated (as in Megatron): use --recompute-granularity selective --recompute-modules moe");
  }
  const bool selective = r.recompute_granularity.value_or("") == "selective" || (r.moe_layer_recompute && !r.recompute_granularity);
  if (selective && r.recompute_num_layers) {
    k.error("--recompute-num-layers with --recompute-granularity selective: it counts the layers of full recompute (Megatron: it must be "
            "unset with selective): drop it");
  }
  if (!selective && r.recompute_modules != RecomputeConfig{}.recompute_modules) {
    k.warn("--recompute-modules has no effect without --recompute-granularity selective");
  }
  for (const std::string& module : selective ? r.recompute_modules : StringList{}) {
    static const char* const kModules[] = {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts", "gdn_norm_out",
                                           "gdp_in_proj", "gdp_qkv", "mhc"};
    if (std::none_of(std::begin(kModules), std::end(kModules), [&](const char* m) { return module == m; })) {
      k.error("--recompute-modules: unknown module '" + module +
              "' (Megatron's: core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts, gdn_norm_out, gdp_in_proj, gdp_qkv, mhc)");
    } else if (module == "moe_act" && !c.moe.moe_grouped_gemm) {
      k.error("--recompute-modules moe_act needs --moe-grouped-gemm (as Megatron)");
    } else if ((module == "moe_act" || module == "layernorm") && c.precision.fp8_format && c.precision.fp8_recipe == "delayed") {
      k.error("Delayed scaling does not support moe_act and layernorm recompute for fp8 (as Megatron): use --fp8-recipe tensorwise or "
              "blockwise, or drop " + module);
    } else if (module == "mla_up_proj" && !c.model.multi_latent_attention) {
      k.error("--recompute-modules mla_up_proj needs --multi-latent-attention (as Megatron): drop it");
    } else if (module.rfind("gdn", 0) == 0 || module.rfind("gdp", 0) == 0 || module == "mhc") {
      k.error("--recompute-modules " + module + " belongs to attention variants megatrain does not implement: drop it");
    } else if (module == "shared_experts" && c.moe.moe_shared_expert_overlap) {
      k.error("--recompute-modules shared_experts cannot work with --moe-shared-expert-overlap (as Megatron): drop one of them");
    }
  }
  if (c.model.num_layers && r.recompute_num_layers && c.parallel.pipeline_model_parallel_size > 0) {
    const int64_t per_stage = *c.model.num_layers / c.parallel.pipeline_model_parallel_size;
    if (r.recompute_method.value_or("") == "block" && *r.recompute_num_layers > per_stage) {
      k.error("--recompute-num-layers " + s(*r.recompute_num_layers) + " exceeds the " + s(per_stage) + " layers per pipeline stage");
    }
  }
  if (c.precision.loss_scale_window < 1) k.error("--loss-scale-window must be >= 1, got " + s(c.precision.loss_scale_window));
  if (c.precision.hysteresis < 1) k.error("--hysteresis must be >= 1, got " + s(c.precision.hysteresis));
  if (c.logging.log_interval < 1) k.error("--log-interval must be >= 1, got " + s(c.logging.log_interval));
  if (c.logging.tensorboard_log_interval < 1) {
    k.error("--tensorboard-log-interval must be >= 1, got " + s(c.logging.tensorboard_log_interval));
  }
  if (c.logging.eval_interval < 1) k.error("--eval-interval must be >= 1, got " + s(c.logging.eval_interval));
  if (c.logging.eval_iters < 0) k.error("--eval-iters must be >= 0, got " + s(c.logging.eval_iters));
}

// The ranges Megatron's semantics need (a negative learning rate or weight decay, a beta of 1 or more, a
// non-positive epsilon all train into nonsense without an error).
void check_values(const Config& c, Checker& k) {
  const auto& t = c.training;
  auto finite_at_least = [&](const char* flag, double v, double lo) {
    if (!std::isfinite(v) || v < lo) k.error(std::string(flag) + " must be a finite number >= " + num(lo) + ", got " + num(v));
  };
  auto fraction = [&](const char* flag, double v, bool one_allowed) {
    if (!std::isfinite(v) || v < 0 || v > 1 || (!one_allowed && v == 1)) {
      k.error(std::string(flag) + " must be in [0, 1" + (one_allowed ? "]" : ")") + ", got " + num(v));
    }
  };
  if (t.lr) finite_at_least("--lr", *t.lr, 0);
  finite_at_least("--min-lr", t.min_lr, 0);
  if (t.decoupled_lr) finite_at_least("--decoupled-lr", *t.decoupled_lr, 0);
  if (t.decoupled_min_lr) finite_at_least("--decoupled-min-lr", *t.decoupled_min_lr, 0);
  if (t.decoupled_min_lr && !t.decoupled_lr) k.error("--decoupled-min-lr needs --decoupled-lr (the embedding's and output layer's peak rate)");
  finite_at_least("--lr-warmup-init", t.lr_warmup_init, 0);
  finite_at_least("--weight-decay", t.weight_decay, 0);
  finite_at_least("--clip-grad", t.clip_grad, 0);
  fraction("--adam-beta1", t.adam_beta1, false);
  fraction("--adam-beta2", t.adam_beta2, false);
  if (!std::isfinite(t.adam_eps) || t.adam_eps <= 0) k.error("--adam-eps must be a finite number > 0, got " + num(t.adam_eps));
  fraction("--sgd-momentum", t.sgd_momentum, true);
  fraction("--optimizer-offload-fraction", t.optimizer_offload_fraction, true);
  finite_at_least("--init-method-std", c.model.init_method_std, 0);
  fraction("--hidden-dropout", c.model.hidden_dropout, false);
  fraction("--attention-dropout", c.model.attention_dropout, false);
  const auto& pr = c.precision;
  if (pr.loss_scale && (!std::isfinite(*pr.loss_scale) || *pr.loss_scale <= 0)) k.error("--loss-scale must be a finite number > 0, got " + num(*pr.loss_scale));
  if (!std::isfinite(pr.initial_loss_scale) || pr.initial_loss_scale <= 0) {
    k.error("--initial-loss-scale must be a finite number > 0, got " + num(pr.initial_loss_scale));
  }
  if (!std::isfinite(pr.min_loss_scale) || pr.min_loss_scale <= 0) k.error("--min-loss-scale must be a finite number > 0, got " + num(pr.min_loss_scale));
}

// NCCL_ALGO under --deterministic-mode (Megatron's apply_determinism_env): every comma-separated token one whose reduction
// order is fixed (Tree's is not).
bool deterministic_nccl_algo(const std::string& value) {
  int tokens = 0;
  std::stringstream in(value);
  for (std::string token; std::getline(in, token, ',');) {
    const auto first = token.find_first_not_of(" \t"), last = token.find_last_not_of(" \t");
    if (first == std::string::npos) continue;
    token = token.substr(first, last - first + 1);
    if (token != "Ring" && token != "CollnetDirect" && token != "CollnetChain" && token != "^NVLS") return false;
    ++tokens;
  }
  return tokens > 0;
}

void check_training(const Config& c, Checker& k) {
  check_values(c, k);
  const auto& t = c.training;
  if (const char* algo = std::getenv("NCCL_ALGO"); t.deterministic_mode && algo != nullptr && !deterministic_nccl_algo(algo)) {
    k.error(std::string("--deterministic-mode: NCCL_ALGO=") + algo + " is not a deterministic setting (each token must be Ring, CollnetDirect, "
            "CollnetChain or ^NVLS, as in Megatron): unset it (megatrain then uses Ring) or set NCCL_ALGO=Ring");
  }
  if (c.moe.moe_use_upcycling) {  // (Megatron asserts --save; its load of the dense model needs --load)
    if (!c.checkpoint.load) k.error("--moe-use-upcycling needs --load: the directory of the dense model's checkpoint to upcycle");
    if (!c.checkpoint.save) k.error("--moe-use-upcycling needs --save: the upcycled model is saved there before training (as in Megatron)");
  }
  if (!t.train_iters && !t.train_samples) k.error("give --train-iters (or --train-samples): how long to train");
  if (t.train_iters && *t.train_iters < 0) k.error("--train-iters must be >= 0, got " + s(*t.train_iters));
  if (t.exit_duration_in_mins && *t.exit_duration_in_mins < 0) k.error("--exit-duration-in-mins must be >= 0, got " + s(*t.exit_duration_in_mins));
  if (!t.lr) k.error("--lr is required for training: add e.g. --lr 3e-4");
  const auto& d = c.data;
  int sources = (d.mock_data ? 1 : 0) + (!d.data_path.empty() ? 1 : 0) + (!d.train_data_path.empty() ? 1 : 0) +
                (d.text_data_path ? 1 : 0);
  if (sources == 0) {
    k.error("no training data: give --mock-data, --data-path PREFIX, --train-data-path PREFIX or --text-data-path FILE");
  } else if (sources > 1) {
    k.error("give one data source: --mock-data, --data-path, --train-data-path or --text-data-path");
  }
}

// YaRN (Megatron's YarnRotaryEmbedding): its settings, and what it does not combine with.
void check_yarn(const Config& c, Checker& k) {
  const ModelConfig& m = c.model;
  const bool mla = m.multi_latent_attention, yarn = m.position_embedding_type == "yarn" || (mla && m.rope_type.value_or("yarn") == "yarn");
  const bool given = m.rotary_scaling_factor != 1.0 || m.yarn_original_max_position_embeddings || m.yarn_beta_fast || m.yarn_beta_slow ||
                     m.mscale != 1.0 || m.mscale_all_dim != 0.0 || m.yarn_correction_range_round_to_int || m.no_yarn_correction_range_round_to_int;
  // (MLA's softmax scale takes --rotary-scaling-factor and --mscale-all-dim whatever its RoPE)
  if (mla && (!std::isfinite(m.rotary_scaling_factor) || m.rotary_scaling_factor <= 0 || !std::isfinite(m.mscale_all_dim))) {
    k.error("--rotary-scaling-factor must be a finite number greater than zero and --mscale-all-dim finite, got " + num(m.rotary_scaling_factor) +
            " and " + num(m.mscale_all_dim));
  }
  if (!yarn) {
    if (given && !mla) {
      k.warn("the YaRN flags (--rotary-scaling-factor, --yarn-*, --mscale*) apply to --position-embedding-type yarn: here they have no effect");
    }
    const bool rope_only = m.yarn_original_max_position_embeddings || m.yarn_beta_fast || m.yarn_beta_slow || m.mscale != 1.0 ||
                           m.yarn_correction_range_round_to_int || m.no_yarn_correction_range_round_to_int;
    if (mla && rope_only) {
      k.warn("--yarn-* and --mscale shape YaRN's RoPE, which --rope-type rope turns off: here they have no effect (--rotary-scaling-factor "
             "and --mscale-all-dim still scale MLA's softmax)");
    }
    return;
  }
  if (!std::isfinite(m.rotary_scaling_factor) || m.rotary_scaling_factor <= 0) {
    k.error("--rotary-scaling-factor must be a finite number greater than zero, got " + num(m.rotary_scaling_factor));
  }
  if (m.yarn_original_max_position_embeddings && *m.yarn_original_max_position_embeddings <= 0) {
    k.error("--yarn-original-max-position-embeddings must be positive, got " + s(*m.yarn_original_max_position_embeddings));
  }
  for (auto [v, flag] : {std::pair{m.yarn_beta_fast, "--yarn-beta-fast"}, std::pair{m.yarn_beta_slow, "--yarn-beta-slow"}}) {
    if (v && (!std::isfinite(*v) || *v <= 0)) k.error(std::string(flag) + " must be a finite number greater than zero, got " + num(*v));
  }
  if (!std::isfinite(m.mscale) || !std::isfinite(m.mscale_all_dim)) k.error("--mscale and --mscale-all-dim must be finite numbers");
  if (m.yarn_beta_fast.value_or(32.0) <= m.yarn_beta_slow.value_or(1.0)) {
    k.warn("--yarn-beta-fast at or below --yarn-beta-slow: YaRN's correction range is empty or reversed (HuggingFace warns the same)");
  }
  if (m.yarn_correction_range_round_to_int && m.no_yarn_correction_range_round_to_int) {
    k.error("--yarn-correction-range-round-to-int and --no-yarn-correction-range-round-to-int contradict each other: give one");
  }
  if (m.rotary_percent != 1.0) {
    k.error("--position-embedding-type yarn with --rotary-percent below 1 is not implemented (Megatron's YaRN takes its frequencies over the "
            "whole head): drop --rotary-percent");
  }
  if (m.use_rope_scaling) k.error("--use-rope-scaling is LLaMA 3.1's scaling of plain RoPE: with --position-embedding-type yarn drop it");
}

// Multi-token prediction (Megatron's rules; what megatrain leaves out is refused by name in train/capabilities.cpp).
void check_mtp(const Config& c, Checker& k) {
  const ModelConfig& m = c.model;
  if (!m.mtp_num_layers) return;
  if (*m.mtp_num_layers <= 0) k.error("--mtp-num-layers must be positive, got " + s(*m.mtp_num_layers) + " (leave it out for no MTP)");
  if (m.mtp_loss_scaling_factor < 0) k.error("--mtp-loss-scaling-factor must not be negative, got " + std::to_string(m.mtp_loss_scaling_factor));
}

// Multi-latent attention (Megatron's MLATransformerConfig and validate_args rules; what megatrain leaves out refused).
void check_mla(const Config& c, Checker& k) {
  const ModelConfig& m = c.model;
  if (m.rope_type && *m.rope_type != "rope" && *m.rope_type != "yarn") k.error("--rope-type must be rope or yarn, got " + *m.rope_type);
  if (!m.multi_latent_attention) {
    if (m.rope_type.value_or("rope") == "yarn") {
      k.error("--rope-type yarn picks multi-latent attention's RoPE (as Megatron): for YaRN elsewhere give --position-embedding-type yarn");
    }
    if (m.mla_down_proj_fusion) k.error("--mla-down-proj-fusion needs --multi-latent-attention (as Megatron)");
    if (m.q_lora_rank || m.cache_mla_latents) k.warn("--q-lora-rank and --cache-mla-latents apply to --multi-latent-attention: here they have no effect");
    return;
  }
  // (MLA rotates its own RoPE part whatever the model's position embedding, as Megatron's: learned_absolute (Megatron's
  // default) adds learned positions at the embedding beside it, none nothing; yarn would hand MLA a rotary embedding of the
  // model's, which Megatron's MLA refuses)
  if (m.position_embedding_type == "yarn") {
    k.error("--multi-latent-attention rotates its own RoPE part (--rope-type yarn for YaRN): give --position-embedding-type rope, "
            "learned_absolute or none, not yarn (Megatron's MLA refuses the model's rotary embedding)");
  }
  if (m.group_query_attention) k.error("--multi-latent-attention and --group-query-attention cannot be combined (as Megatron): drop one");
  if (m.rotary_interleaved) k.error("--rotary-interleaved does not work with --multi-latent-attention (as Megatron): drop it");
  if (m.q_lora_rank && *m.q_lora_rank <= 0) k.error("--q-lora-rank must be positive, got " + s(*m.q_lora_rank));
  for (auto [v, flag] : {std::pair{m.kv_lora_rank, "--kv-lora-rank"}, std::pair{m.qk_head_dim, "--qk-head-dim"},
                         std::pair{m.qk_pos_emb_head_dim, "--qk-pos-emb-head-dim"}, std::pair{m.v_head_dim, "--v-head-dim"}}) {
    if (v <= 0) k.error(std::string(flag) + " must be positive, got " + s(v));
  }
  if (m.qk_pos_emb_head_dim % 2 != 0) k.error("--qk-pos-emb-head-dim must be even (RoPE rotates pairs), got " + s(m.qk_pos_emb_head_dim));
  if (m.cache_mla_latents) k.error("--cache-mla-latents is for inference; training with it is refused (as Megatron): drop it");
  if (m.qk_layernorm && !m.q_lora_rank) {
    k.error("--qk-layernorm with --multi-latent-attention and no --q-lora-rank is not implemented (Megatron then norms the hidden state again "
            "before the query projection): give --q-lora-rank, or drop --qk-layernorm");
  }
  if (m.rotary_percent != 1.0) k.error("--rotary-percent below 1 with --multi-latent-attention is not implemented: drop it");
  if (m.use_rope_scaling || m.rotary_seq_len_interpolation_factor) {
    k.error("--use-rope-scaling and --rotary-seq-len-interpolation-factor with --multi-latent-attention are not implemented: drop them");
  }
  if (m.no_rope_freq) k.error("--no-rope-freq with --multi-latent-attention is not implemented: drop it");
  if (m.add_qkv_bias) k.warn("--add-qkv-bias has no effect with --multi-latent-attention (its projections have no biases, as Megatron's)");
  if (m.kv_channels) k.warn("--kv-channels has no effect with --multi-latent-attention (--qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim set its heads)");
  if (c.precision.fp8_format) k.error("FP8 with --multi-latent-attention is not implemented (its projections run in 16 bits only): drop --fp8-format");
}

void check_activation(const Config& c, Checker& k) {
  const ModelConfig& m = c.model;
  if (m.squared_relu && m.swiglu) k.error("--squared-relu and --swiglu are two activations: give one");
  if (m.squared_relu && m.openai_gelu) k.error("--squared-relu and --openai-gelu are two activations: give one");
  if (m.quick_geglu && m.swiglu) k.error("--quick-geglu and --swiglu are two activations: give one");
  if (m.quick_geglu && m.squared_relu) k.error("--quick-geglu and --squared-relu are two activations: give one");
  if (!std::isfinite(m.glu_linear_offset)) k.error("--glu-linear-offset must be a finite number, got " + num(m.glu_linear_offset));
  if (m.glu_linear_offset != 0.0 && m.swiglu) {
    k.warn("--glu-linear-offset with --swiglu: Megatron raises it under its default bias-SwiGLU fusion (it runs with --no-bias-swiglu-fusion); "
           "megatrain computes it either way");
  }
  if (m.glu_linear_offset != 0.0 && !gated_mlp(m)) {
    k.warn("--glu-linear-offset applies to a gated MLP (--swiglu or --quick-geglu): without one it has no effect (as in Megatron)");
  }
  if (const auto& v = m.activation_func_clamp_value) {  // (Megatron's rules for SwiGLU's clamp: finite, positive, MoE only, no offset)
    if (!std::isfinite(*v) || *v <= 0) k.error("--activation-func-clamp-value must be a finite number greater than zero, got " + num(*v));
    if (!gated_mlp(m)) {
      k.warn("--activation-func-clamp-value applies to a gated MLP (--quick-geglu, or --swiglu with MoE): without one it has no effect");
    }
    if (m.swiglu && !c.moe.num_experts) k.error("--activation-func-clamp-value with --swiglu needs MoE (--num-experts), as in Megatron");
    if (m.swiglu && m.glu_linear_offset != 0.0) k.error("--activation-func-clamp-value with --swiglu needs --glu-linear-offset 0, as in Megatron");
  }
  if (m.rotary_interleaved && m.position_embedding_type != "rope") {
    k.error("--rotary-interleaved needs --position-embedding-type rope");
  }
}

// FP8 (Megatron's fp8 arguments; Transformer Engine's recipes).
void check_fp8(const Config& c, Checker& k) {
  const auto& p = c.precision;
  if (p.fp8_amax_history_len < 1) k.error("--fp8-amax-history-len must be >= 1, got " + s(p.fp8_amax_history_len));
  if (p.fp8_margin < 0) k.error("--fp8-margin must be >= 0 (powers of 2 of headroom), got " + s(p.fp8_margin));
  if (p.fp8_format && p.first_last_layers_bf16 && p.fp8_recipe == "delayed") {
    k.error("--first-last-layers-bf16 does not work with --fp8-recipe delayed (as in Megatron: delayed scaling reduces its amaxes once per "
            "forward, not per layer): use --fp8-recipe tensorwise, or drop --first-last-layers-bf16");
  }
  if (p.first_last_layers_bf16) {
    if (p.num_layers_at_start_in_bf16 < 0 || p.num_layers_at_end_in_bf16 < 0) {
      k.error("--num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16 must be >= 0");
    } else if (c.model.num_layers && p.num_layers_at_start_in_bf16 + p.num_layers_at_end_in_bf16 > *c.model.num_layers) {
      k.error("--num-layers-at-start-in-bf16 " + s(p.num_layers_at_start_in_bf16) + " + --num-layers-at-end-in-bf16 " +
              s(p.num_layers_at_end_in_bf16) + " exceed the " + s(*c.model.num_layers) + " layers: lower them");
    }
  }
  if (!p.fp8_format && (p.first_last_layers_bf16 || p.no_fp8_wgrad)) {
    k.warn(std::string(p.first_last_layers_bf16 ? "--first-last-layers-bf16" : "--no-fp8-wgrad") + " has no effect without --fp8-format");
  }
}

bool any_coefficient(const MoeConfig& m) {
  return std::any_of(m.moe_aux_loss_coeff.begin(), m.moe_aux_loss_coeff.end(), [](double x) { return x > 0; });
}

// --moe-router-load-balancing-type and --moe-aux-loss-coeff: one type with one coefficient, or Megatron's list form
// (several auxiliary losses at once, a coefficient each; TransformerConfig asserts the lengths match).
void validate_load_balancing(const MoeConfig& m, Checker& k) {
  const StringList& types = m.moe_router_load_balancing_type;
  const FloatList& coeffs = m.moe_aux_loss_coeff;
  for (double x : coeffs) {
    if (!(x >= 0) || !std::isfinite(x)) k.error("--moe-aux-loss-coeff must be >= 0, got " + num(x));
  }
  if (types.empty()) k.error("--moe-router-load-balancing-type needs a type (aux_loss, seq_aux_loss, global_aux_loss, sinkhorn, quantile_balancing or none)");
  if (coeffs.empty()) k.error("--moe-aux-loss-coeff needs a value (0 for no auxiliary loss)");
  if (types.size() == 1 && coeffs.size() > 1) {
    k.error("--moe-aux-loss-coeff gives " + s(static_cast<int64_t>(coeffs.size())) + " coefficients for the one load-balancing type " +
            types[0] + ": give one, or a type for each in --moe-router-load-balancing-type (Megatron's list form)");
  }
  if (types.size() < 2) return;
  if (coeffs.size() != types.size()) {
    k.error("--moe-router-load-balancing-type gives " + s(static_cast<int64_t>(types.size())) + " types and --moe-aux-loss-coeff " +
            s(static_cast<int64_t>(coeffs.size())) + " coefficients: give a coefficient for each type, in the same order (as Megatron)");
  }
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] == "sinkhorn" || types[i] == "quantile_balancing") {
      k.error("--moe-router-load-balancing-type " + types[i] + " balances the routing by itself and takes no auxiliary loss: give it alone "
              "(Megatron's list form combines aux_loss, seq_aux_loss and global_aux_loss)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (types[j] == types[i]) k.error("--moe-router-load-balancing-type names " + types[i] + " twice: give each type once, with one coefficient");
    }
  }
}

// --moe-router-load-balancing-type quantile_balancing (Megatron's QB: router.quantile_balancing, moe_utils.qb_dual_update).
void check_quantile_balancing(const Config& c, Checker& k) {
  const MoeConfig& m = c.moe;
  const double ema = m.moe_router_quantile_balancing_ema;
  if (!m.load_balancing_is("quantile_balancing")) {
    if (ema != 0) k.warn("--moe-router-quantile-balancing-ema has no effect without --moe-router-load-balancing-type quantile_balancing");
    return;
  }
  // (1 keeps the bias as loaded; Megatron checks no range)
  if (!(ema >= 0 && ema <= 1)) k.error("--moe-router-quantile-balancing-ema must be in [0, 1], got " + num(ema));
  const int64_t E = m.num_experts.value_or(0), topk = m.moe_router_topk;
  if (topk >= E) {
    k.error("quantile_balancing chooses by the top k + 1 of each token's biased logits: --moe-router-topk " + s(topk) +
            " must be below --num-experts " + s(E));
  }
  if (m.moe_router_num_groups || m.moe_router_group_topk) {
    k.error("quantile_balancing does not support group-limited routing (as in Megatron): drop --moe-router-num-groups and --moe-router-group-topk");
  }
  if (m.moe_router_enable_expert_bias) {
    k.error("quantile_balancing balances with its own per-expert bias (qb_beta) and never reads the expert bias: drop "
            "--moe-router-enable-expert-bias");
  }
  if (any_coefficient(m)) {
    k.warn("--moe-aux-loss-coeff has no effect with quantile_balancing (its bias balances the load; Megatron computes no aux loss "
           "with it)");
  }
  const int64_t tokens = c.training.micro_batch_size.value_or(1) * c.data.seq_length.value_or(0);
  if (tokens > 0 && E > 0 && (tokens * topk) % E != 0) {
    k.error("quantile_balancing needs each microbatch's choices (--micro-batch-size x --seq-length x --moe-router-topk = " + s(tokens * topk) +
            ") divisible by --num-experts " + s(E) + " (Megatron asserts it): change one of them");
  }
}

// Megatron's MoE rules (transformer_config.py, arguments.py, MoELayer), each with the fix.
void check_moe(const Config& c, Checker& k) {
  const MoeConfig& m = c.moe;
  if (m.moe_use_upcycling && (!m.num_experts || *m.num_experts < 1)) {
    k.error("--moe-use-upcycling turns a dense checkpoint into an MoE model: give the MoE model's flags (--num-experts and the others)");
  }
  if (m.moe_upcycling_granularity != 1 && !m.moe_use_upcycling) k.warn("--moe-upcycling-granularity has no effect without --moe-use-upcycling");
  if (!m.num_experts || *m.num_experts < 1) return;
  const int64_t E = *m.num_experts, topk = m.moe_router_topk;
  if (m.moe_use_upcycling && (m.moe_upcycling_granularity < 1 || E % m.moe_upcycling_granularity != 0)) {
    k.error("--moe-upcycling-granularity must be a positive divisor of --num-experts " + s(E) + ", got " + s(m.moe_upcycling_granularity));
  }
  const int64_t tp = c.parallel.tensor_model_parallel_size, etp = c.parallel.expert_tensor_parallel_size.value_or(tp);
  // The flex dispatcher (Megatron's TransformerConfig and MoEFlexTokenDispatcher checks; megatrain runs it as its all-to-all).
  const bool flex = m.moe_token_dispatcher_type == "flex";
  const std::string backend = m.moe_enable_deepep ? "deepep" : m.moe_flex_dispatcher_backend;
  if (m.moe_enable_deepep) {
    if (!flex) k.error("--moe-enable-deepep needs --moe-token-dispatcher-type flex (as Megatron: DeepEP is the flex dispatcher's backend)");
    if (m.moe_flex_dispatcher_backend == "hybridep") k.error("--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: give one backend");
    k.warn("--moe-enable-deepep is deprecated in Megatron: use --moe-flex-dispatcher-backend deepep");
  }
  if (m.moe_flex_dispatcher_backend == "ncclep" && !flex) {
    k.error("--moe-flex-dispatcher-backend ncclep needs --moe-token-dispatcher-type flex (as Megatron)");
  }
  if (flex && backend == "ncclep" && (m.moe_pad_expert_input_to_capacity || m.moe_expert_capacity_factor.value_or(-1.0) > 0)) {
    k.error("--moe-token-dispatcher-type flex with the ncclep backend does not take a capacity (--moe-expert-capacity-factor, "
            "--moe-pad-expert-input-to-capacity; as Megatron): drop it, or use --moe-token-dispatcher-type alltoall");
  }
  if (flex && m.moe_pad_expert_input_to_capacity && backend == "deepep") {
    k.error("--moe-token-dispatcher-type flex with the deepep backend does not take --moe-pad-expert-input-to-capacity (as Megatron): "
            "use --moe-flex-dispatcher-backend hybridep or --moe-token-dispatcher-type alltoall");
  }
  if (flex && backend != "hybridep" && etp * c.parallel.expert_model_parallel_size < 2) {
    k.error("--moe-token-dispatcher-type flex with the " + backend + " backend needs expert-TP x EP > 1 (as Megatron's dispatcher asserts): "
            "use --moe-token-dispatcher-type alltoall on one expert rank");
  }
  if (c.model.num_layers) {
    try {
      (void)parse_moe_layer_freq(m.moe_layer_freq, *c.model.num_layers);
    } catch (const ConfigError& e) {
      k.error(e.what());
    }
  }
  if (tp > 1 && !c.parallel.sequence_parallel) {
    k.error("an MoE model with --tensor-model-parallel-size " + s(tp) + " needs --sequence-parallel (Megatron's MoE layer requires it): add it");
  }
  const int64_t ffn = m.moe_ffn_hidden_size.value_or(c.model.ffn_hidden_size.value_or(0));
  if (ffn > 0 && etp > 0 && ffn % etp != 0) {
    k.error("the expert MLP width " + s(ffn) + " (--moe-ffn-hidden-size) is not divisible by the expert tensor-parallel size " + s(etp) +
            ": change --moe-ffn-hidden-size or --expert-tensor-parallel-size");
  }
  if (m.moe_shared_expert_intermediate_size) {
    const int64_t sh = *m.moe_shared_expert_intermediate_size;
    if (sh < 1 || sh % tp != 0) {
      k.error("--moe-shared-expert-intermediate-size " + s(sh) + " must be positive and divisible by --tensor-model-parallel-size " + s(tp));
    }
    if (!c.model.disable_bias_linear) {
      k.error("shared experts have no biases (Megatron's SharedExpertMLP): add --disable-bias-linear or drop --moe-shared-expert-intermediate-size");
    }
  }
  if (m.moe_shared_expert_overlap && m.moe_token_dispatcher_type != "alltoall" && m.moe_token_dispatcher_type != "flex") {
    k.error("--moe-shared-expert-overlap works only with --moe-token-dispatcher-type alltoall or flex (as in Megatron)");
  }
  if (m.moe_shared_expert_gate && !m.moe_shared_expert_intermediate_size) {
    k.warn("--moe-shared-expert-gate has no effect without a shared expert (--moe-shared-expert-intermediate-size)");
  }
  if (m.moe_shared_expert_overlap && !m.moe_shared_expert_intermediate_size) {
    k.error("--moe-shared-expert-overlap needs a shared expert: add --moe-shared-expert-intermediate-size");
  }
  if (!c.model.disable_bias_linear && etp > 1) {
    k.error("experts with biases need --expert-tensor-parallel-size 1 (as in Megatron): add --disable-bias-linear or set "
            "--expert-tensor-parallel-size 1");
  }
  if (m.moe_input_jitter_eps && !(*m.moe_input_jitter_eps > 0 && *m.moe_input_jitter_eps < 1)) {
    k.error("--moe-input-jitter-eps must be in (0, 1) (the noise is uniform in [1 - eps, 1 + eps]), got " + std::to_string(*m.moe_input_jitter_eps));
  }
  validate_load_balancing(m, k);
  if (m.load_balancing_is("sinkhorn")) {  // (Megatron's sinkhorn_load_balancing; docs/moe.md)
    if (any_coefficient(m)) k.error("--moe-router-load-balancing-type sinkhorn takes no aux loss (as in Megatron): set --moe-aux-loss-coeff 0");
    if (m.moe_router_enable_expert_bias) k.error("--moe-router-enable-expert-bias does not apply to sinkhorn routing: drop one of them");
    if (m.moe_router_num_groups) k.error("group-limited routing (--moe-router-num-groups) does not apply to sinkhorn routing: drop one of them");
    if (m.moe_router_topk_scaling_factor) k.error("--moe-router-topk-scaling-factor does not apply to sinkhorn routing: drop one of them");
    if (m.moe_router_score_function != "softmax" || m.moe_router_pre_softmax) {
      k.warn("sinkhorn routing has its own scores (sigmoid at --moe-router-topk 1, else the softmax over all experts): "
             "--moe-router-score-function and --moe-router-pre-softmax have no effect with it");
    }
  }
  check_quantile_balancing(c, k);
  if (m.moe_router_score_function == "softmax" && topk == 1 && !m.moe_router_pre_softmax && !m.load_balancing_is("sinkhorn")) {
    k.error("--moe-router-topk 1 with softmax scores after the choice gives every token the weight 1 and the router no gradient "
            "(Megatron refuses it too): add --moe-router-pre-softmax, or use --moe-router-score-function sigmoid");
  }
  if (m.moe_router_topk_scaling_factor && !(*m.moe_router_topk_scaling_factor > 0)) {
    k.error("--moe-router-topk-scaling-factor must be > 0, got " + std::to_string(*m.moe_router_topk_scaling_factor));
  }
  if (m.moe_router_group_topk && !m.moe_router_num_groups) k.error("--moe-router-group-topk needs --moe-router-num-groups");
  if (m.moe_router_num_groups) {
    const int64_t g = *m.moe_router_num_groups, gt = m.moe_router_group_topk.value_or(0);
    if (g < 1 || E % g != 0) k.error("--num-experts " + s(E) + " is not divisible by --moe-router-num-groups " + s(g));
    if (!m.moe_router_group_topk) k.error("--moe-router-num-groups needs --moe-router-group-topk (the groups each token may use)");
    else if (gt < 1 || gt > g) k.error("--moe-router-group-topk " + s(gt) + " must be between 1 and --moe-router-num-groups " + s(g));
    else if (topk % gt != 0 || (g >= 1 && E % g == 0 && topk / gt > E / g)) {
      k.error("--moe-router-topk " + s(topk) + " must be a multiple of --moe-router-group-topk " + s(gt) + ", and topk / group_topk (" +
              s(gt > 0 ? topk / gt : 0) + ") at most the experts per group (" + s(g > 0 ? E / g : 0) + ")");
    }
  }
  if (m.moe_router_enable_expert_bias && m.moe_router_score_function == "softmax") {
    k.error("--moe-router-enable-expert-bias supports only --moe-router-score-function sigmoid or sqrtsoftplus (as in Megatron)");
  }
  // A negative capacity factor is dropless routing, as Megatron's TransformerConfig makes it (None; resolve() unsets it).
  const bool capacity = m.moe_expert_capacity_factor && *m.moe_expert_capacity_factor >= 0;
  if (m.moe_expert_capacity_factor && *m.moe_expert_capacity_factor < 0) {
    k.warn("--moe-expert-capacity-factor " + std::to_string(*m.moe_expert_capacity_factor) + " is negative: dropless routing (as in Megatron)");
  }
  if (capacity && !(*m.moe_expert_capacity_factor > 0)) {
    k.error("--moe-expert-capacity-factor 0 would drop every token: give a factor > 0, or leave it unset (or negative) for dropless routing");
  }
  if (capacity && std::any_of(m.moe_router_load_balancing_type.begin(), m.moe_router_load_balancing_type.end(), [](const std::string& t) {
        return t != "aux_loss" && t != "seq_aux_loss" && t != "global_aux_loss" && t != "none";
      })) {
    k.error("--moe-expert-capacity-factor works only with --moe-router-load-balancing-type aux_loss, seq_aux_loss, global_aux_loss or none "
            "(as in Megatron)");
  }
  if (m.moe_apply_probs_on_input && m.moe_router_topk != 1) {
    k.error("--moe-apply-probs-on-input works only with --moe-router-topk 1 (as in Megatron): set --moe-router-topk 1, or drop it");
  }
  if (m.moe_pad_expert_input_to_capacity && !capacity) {
    k.error("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  }
  if (m.moe_z_loss_coeff && (*m.moe_z_loss_coeff < 0 || !std::isfinite(*m.moe_z_loss_coeff))) k.error("--moe-z-loss-coeff must be >= 0");
  if (m.moe_router_bias_update_rate < 0) k.error("--moe-router-bias-update-rate must be >= 0");
}

}  // namespace

Diagnostics validate_vocabulary(const Config& c) {
  Checker k;
  const ModelConfig& m = c.model;
  const int64_t tp = c.parallel.tensor_model_parallel_size;
  // The embedding's rows as given (--padded-vocab-size) or unpadded (--no-pad-vocab-size): split over TP, holding the
  // vocabulary.
  const int64_t rows = c.derived.padded_vocab_size, vocab = c.derived.vocab_size;
  const std::string rows_flag = m.padded_vocab_size ? "--padded-vocab-size" : "--no-pad-vocab-size";
  if ((m.padded_vocab_size || m.no_pad_vocab_size) && rows > 0 && tp > 0 && rows % tp != 0) {
    k.error(rows_flag + ": the embedding's " + s(rows) + " rows do not split over TP " + s(tp) + ": give a multiple of " + s(tp) +
            (m.padded_vocab_size ? "" : " (or drop --no-pad-vocab-size)"));
  }
  if (m.padded_vocab_size && vocab > 0 && *m.padded_vocab_size < vocab) {
    k.error("--padded-vocab-size " + s(*m.padded_vocab_size) + " is below the vocabulary's " + s(vocab) + " ids: give at least " + s(vocab));
  }
  return k.d;
}

Diagnostics validate(const Config& c, int64_t world, Purpose purpose) {
  Checker k;
  if (world < 1) k.error("world size must be >= 1, got " + s(world));
  check_required(c, purpose, k);
  if (world >= 1) {
    check_parallel_sizes(c, world, k);
    check_batch_and_sequence(c, world, k);
  }
  check_pipeline(c, k);
  check_attention(c, k);
  check_moe(c, k);
  check_activation(c, k);
  check_yarn(c, k);
  check_mla(c, k);
  check_mtp(c, k);

  check_fp8(c, k);
  check_exclusive_and_misc(c, purpose, k);
  if (purpose == Purpose::kTrain) check_training(c, k);
  return k.d;
}

}  // namespace mt
