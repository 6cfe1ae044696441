// capabilities.cpp: the honest list of what the engine does not do yet.
#include "train/capabilities.h"

namespace mt {

std::vector<std::string> unsupported_features(const Config& c, int64_t world) {
  std::vector<std::string> out;
  auto no = [&](bool used, const std::string& what) {
    if (used) out.push_back(what);
  };
  const auto& p = c.parallel;
  (void)world;
  no(p.pipeline_model_parallel_size > 1, "--pipeline-model-parallel-size > 1 is not implemented yet");
  no(p.context_parallel_size > 1, "--context-parallel-size > 1 is not implemented yet");
  no(p.expert_model_parallel_size > 1, "--expert-model-parallel-size > 1 is not implemented yet");
  no(c.moe.num_experts.has_value(), "mixture of experts (--num-experts) is not implemented yet");
  no(c.precision.fp8_format.has_value(), "FP8 training (--fp8-format) is not implemented yet: use --bf16");
  no(c.recompute.recompute_granularity.has_value(),
     "activation recompute (--recompute-granularity) is not implemented yet: drop it (the CPU engine keeps all activations)");
  no(c.model.qk_layernorm, "--qk-layernorm is not implemented yet");
  no(p.tensor_model_parallel_size > 1 && c.model.group_query_attention && c.model.num_query_groups < p.tensor_model_parallel_size,
     "--num-query-groups below --tensor-model-parallel-size (K/V replication) is not implemented yet: use TP <= query groups");
  no(c.data.reset_attention_mask, "--reset-attention-mask is not implemented yet");
  no(c.data.dataloader_type == "cyclic" || c.data.dataloader_type == "external",
     "--dataloader-type " + c.data.dataloader_type + " is not implemented: megatrain reads samples in order (single)");
  const std::string tok = c.data.tokenizer_type.value_or("");
  no(tok == "HuggingFaceTokenizer",
     "--tokenizer-type HuggingFaceTokenizer is not implemented yet: use GPT2BPETokenizer, NullTokenizer or ByteTokenizer");
  no((!c.data.data_path.empty() || !c.data.train_data_path.empty()) && tok.empty(),
     "--data-path needs --tokenizer-type (GPT2BPETokenizer with --vocab-file/--merge-file, or NullTokenizer with --vocab-size)");
  no(c.checkpoint.ckpt_format != "torch_dist",
     "--ckpt-format " + c.checkpoint.ckpt_format + " is not supported: megatrain writes its own sharded, reshardable format "
     "(leave --ckpt-format at its default)");
  no(c.logging.tensorboard_dir.has_value(), "--tensorboard-dir is not supported: metrics go to metrics.jsonl under --log-dir");
  no(c.logging.wandb_project.has_value(), "--wandb-project is not supported: metrics go to metrics.jsonl under --log-dir");
  no(c.logging.profile, "--profile is not implemented yet");
  no(c.logging.timing_log_level > 0, "--timing-log-level > 0 is not implemented yet");
  no(!c.training.rampup_batch_size.empty(), "--rampup-batch-size is not implemented yet");
  no(c.logging.device == "cuda", "--device cuda: this build has no CUDA training engine yet; use --device cpu");
  return out;
}

}  // namespace mt
