// hf_import.cpp: config.json becomes Megatron flags (parsed by the same flag table as the command line, so the
// checkpoint stores an ordinary configuration); each megatrain tensor of a one-rank model is filled from HF's,
// and every HF tensor must be used: a missing or a leftover tensor, or a shape that differs, is named.
#include "interop/hf_import.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <iomanip>
#include <set>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "kernels/rope_frequencies.h"
#include "config/cli.h"
#include "config/errors.h"
#include "config/moe_pattern.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "interop/hf_layout.h"
#include "interop/mxfp4.h"
#include "kernels/cpu/fp8.h"
#include "interop/safetensors.h"
#include "model/gpt_model.h"
#include "model/model_dims.h"
#include "optim/optimizer.h"

namespace mt {
namespace fs = std::filesystem;
namespace {

// A top-1 router whose one weight is renormalised to 1 (Mixtral; Qwen's norm_topk_prob) is Megatron's softmax after a
// top-1 choice, which Megatron refuses.
const char* const kTopOneRenormalised =
    "a top-1 MoE whose one routing weight is renormalised to 1 (Mixtral, or Qwen's norm_topk_prob) has no Megatron form: "
    "Megatron refuses a softmax after a top-1 choice (its router would get no gradient)";

using hf::HfMoeNames;
using hf::Values;
using hf::hf_moe_names;
using hf::merge_qkv;
using hf::transposed;
using json = nlohmann::json;

// The safetensors files of a directory (one, or the index's shards), tensor name -> file.
class HfWeights {
 public:
  explicit HfWeights(const fs::path& dir) {
    const fs::path index = dir / "model.safetensors.index.json";
    std::vector<std::string> files;
    if (fs::exists(index)) {
      std::ifstream in(index);
      json j;
      try {
        j = json::parse(in);
      } catch (const std::exception& e) {
        throw DataError(index.string() + " is not valid JSON (" + e.what() + ")");
      }
      std::set<std::string> names;
      if (!j.contains("weight_map") || !j["weight_map"].is_object()) throw DataError(index.string() + " has no \"weight_map\" object");
      for (const auto& [k, v] : j["weight_map"].items()) names.insert(v.get<std::string>());
      files.assign(names.begin(), names.end());
    } else if (fs::exists(dir / "model.safetensors")) {
      files.push_back("model.safetensors");
    } else {
      throw DataError(dir.string() + " has neither model.safetensors nor model.safetensors.index.json (PyTorch .bin weights are not read: "
                      "save them as safetensors)");
    }
    for (const auto& f : files) {
      auto file = std::make_shared<SafetensorsFile>((dir / f).string());
      for (const auto& [name, e] : file->entries()) {
        if (!where_.emplace(name, file).second) throw DataError("the tensor " + name + " is in two safetensors files of " + dir.string());
      }
    }
  }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // `base`: the base model's prefix ("transformer." for GPT-2, "model." for LLaMA), which checkpoints of the base
  // model alone (GPT-2's own files: wte.weight, h.0.attn...) leave out; HF's loader accepts both, so does this.
  void set_base_prefix(std::string base) { base_ = std::move(base); }
  // quantization_config's quant_method "fp8" (DeepSeek-V3's released checkpoints): the linear layers' weights stored as
  // F8_E4M3 bytes, each block of block_rows x block_cols (weight_block_size) times its `<name>_scale_inv` entry.
  void set_fp8_blocks(int64_t block_rows, int64_t block_cols) {
    fp8_block_rows_ = block_rows;
    fp8_block_cols_ = block_cols;
  }
  Values take(const std::string& wanted, const std::vector<int64_t>& shape) {
    const std::string name = located(wanted);
    const SafetensorsFile& file = checked(name, shape);
    used_.insert(name);
    if (file.entry(name).dtype == "F8_E4M3") return dequantized_fp8(file, name, shape);
    return file.read_f32(name);
  }
  // Stacked experts' weights [experts, in, out] (GPT-OSS's gate_up_proj, down_proj): the tensor itself, or, in a
  // checkpoint quantized to MXFP4 (mxfp4.h), its `_blocks` [experts, out, in / 32, 16] and `_scales` [experts, out,
  // in / 32], dequantized and transposed as transformers' convert_moe_packed_tensors does.
  Values take_experts(const std::string& wanted, int64_t experts, int64_t in, int64_t out) {
    const std::string blocks_name = located(wanted + "_blocks");
    if (!where_.count(blocks_name)) return take(wanted, {experts, in, out});
    if (in % kMxfp4GroupSize != 0) {
      throw DataError("the HuggingFace tensor " + blocks_name + " is MXFP4, whose groups of 32 need an input size that is a multiple of 32, not " + std::to_string(in));
    }
    const int64_t groups = in / kMxfp4GroupSize;
    const std::string scales_name = located(wanted + "_scales");
    const SafetensorsFile& blocks_file = checked(blocks_name, {experts, out, groups, kMxfp4GroupSize / 2});
    const SafetensorsFile& scales_file = checked(scales_name, {experts, out, groups});
    used_.insert(blocks_name);
    used_.insert(scales_name);
    const Values rows = mxfp4_dequantize(blocks_file.read_u8(blocks_name), scales_file.read_u8(scales_name), experts * out, groups, blocks_name);
    Values values(rows.size());
    for (int64_t e = 0; e < experts; ++e) {
      const Values one = transposed(Values(rows.begin() + e * out * in, rows.begin() + (e + 1) * out * in), out, in);
      std::copy(one.begin(), one.end(), values.begin() + e * in * out);
    }
    ++dequantized_;
    return values;
  }
  int64_t dequantized() const { return dequantized_; }
  int64_t dequantized_fp8() const { return dequantized_fp8_; }
  // An F8_E4M3 weight [rows, cols] times its blocks' scales (`<name>_scale_inv` [ceil(rows / br), ceil(cols / bc)]).
  Values dequantized_fp8(const SafetensorsFile& file, const std::string& name, const std::vector<int64_t>& shape) {
    if (fp8_block_rows_ == 0) {
      throw DataError("the HuggingFace tensor " + name + " is F8_E4M3 but config.json has no quantization_config of quant_method fp8 (its "
                      "block size and scales): dequantize the checkpoint first");
    }
    if (shape.size() != 2) throw DataError("the HuggingFace tensor " + name + " is F8_E4M3 but not a matrix (megatrain reads FP8 linear weights)");
    const int64_t rows = shape[0], cols = shape[1], br = fp8_block_rows_, bc = fp8_block_cols_;
    const int64_t block_rows = (rows + br - 1) / br, block_cols = (cols + bc - 1) / bc;
    const std::string scale_name = name + "_scale_inv";
    const Values scale = where_.count(scale_name) ? checked(scale_name, {block_rows, block_cols}).read_f32(scale_name) : Values{};
    if (scale.empty()) throw DataError("the HuggingFace tensor " + name + " is F8_E4M3 without its " + scale_name);
    used_.insert(scale_name);
    const std::vector<uint8_t> bytes = file.read_u8_any(name);
    Values out(bytes.size());
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        const size_t k = static_cast<size_t>(i * cols + j);
        out[k] = cpu::fp8_decode(bytes[k], cpu::Fp8Format::kE4M3) * scale[static_cast<size_t>((i / br) * block_cols + j / bc)];
        if (!std::isfinite(out[k])) throw DataError("the HuggingFace tensor " + name + " holds a NaN (an FP8 NaN byte or scale): the checkpoint is damaged");
      }
    }
    ++dequantized_fp8_;
    return out;
  }
  // The stored name of `wanted`: itself, or without the base model's prefix.
  std::string located(const std::string& wanted) const {
    if (!where_.count(wanted) && !base_.empty() && wanted.rfind(base_, 0) == 0 && where_.count(wanted.substr(base_.size()))) return wanted.substr(base_.size());
    return wanted;
  }
  // The file holding `name`, whose shape must be `shape`.
  const SafetensorsFile& checked(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = where_.find(name);
    if (it == where_.end()) throw DataError("the HuggingFace weights have no tensor " + name);
    const auto& e = it->second->entry(name);
    if (e.shape != shape) {
      std::ostringstream s;
      s << "the HuggingFace tensor " << name << " has shape [";
      for (size_t i = 0; i < e.shape.size(); ++i) s << (i ? ", " : "") << e.shape[i];
      s << "], config.json implies [";
      for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
      s << "]";
      throw DataError(s.str());
    }
    return *it->second;
  }
  std::vector<std::string> unused() const {
    std::vector<std::string> out;
    for (const auto& [name, f] : where_) {
      if (!used_.count(name)) out.push_back(name);
    }
    return out;
  }

 private:
  std::map<std::string, std::shared_ptr<SafetensorsFile>> where_;
  std::set<std::string> used_;
  std::string base_;
  int64_t dequantized_ = 0, dequantized_fp8_ = 0;
  int64_t fp8_block_rows_ = 0, fp8_block_cols_ = 0;
};

template <typename T>
T field(const json& c, const char* key, T fallback) {
  return c.contains(key) && !c[key].is_null() ? c[key].get<T>() : fallback;
}

std::vector<std::string> import_checked(const HfImportOptions& opt, const fs::path& dir, const json& hc);

}  // namespace

std::vector<std::string> import_hf(const HfImportOptions& opt) {
  const fs::path dir(opt.hf_dir);
  json hc;
  {
    std::ifstream in(dir / "config.json");
    if (!in) throw DataError((dir / "config.json").string() + " not found: give a HuggingFace model directory");
    try {
      hc = json::parse(in);
    } catch (const std::exception& e) {
      throw DataError((dir / "config.json").string() + " is not valid JSON (" + e.what() + ")");
    }
  }
  try {
    return import_checked(opt, dir, hc);
  } catch (const nlohmann::json::exception& e) {
    throw DataError((dir / "config.json").string() + " lacks a field the model needs or has one of the wrong type (" + e.what() + ")");
  }
}

namespace {

std::vector<std::string> import_checked(const HfImportOptions& opt, const fs::path& dir, const json& hc) {
  const std::string arch = hc.contains("architectures") && !hc["architectures"].empty() ? hc["architectures"][0].get<std::string>() : "";
  auto refuse = [](bool bad, const std::string& why) {
    if (bad) throw ConfigError("cannot import: " + why);
  };
  // The weights' index, read once where first needed (config.json's problems are reported before the weights')
  std::unique_ptr<HfWeights> weights;
  auto open_weights = [&]() -> HfWeights& {
    if (!weights) weights = std::make_unique<HfWeights>(dir);
    return *weights;
  };
  // Every size config.json gives must be a positive integer.
  for (const char* key : {"n_embd", "n_layer", "n_head", "n_inner", "n_positions", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings", "vocab_size", "num_local_experts",
                          "num_experts_per_tok"}) {
    if (!hc.contains(key) || hc[key].is_null()) continue;
    if (!hc[key].is_number_integer() || hc[key].get<int64_t>() <= 0 || hc[key].get<int64_t>() > (int64_t{1} << 40)) {
      throw DataError((dir / "config.json").string() + ": \"" + key + "\" must be a positive integer, got " + hc[key].dump());
    }
  }
  std::ostringstream flags;
  flags << std::setprecision(17);
  std::string family;
  std::pair<int64_t, int64_t> fp8_blocks{0, 0};  // quantization_config's fp8 weight_block_size (0: none)
  if (arch == "GPT2LMHeadModel") {
    family = "gpt2";
    const int64_t h = hc.at("n_embd").get<int64_t>(), pos = hc.at("n_positions").get<int64_t>();
    const std::string act = field<std::string>(hc, "activation_function", "gelu_new");
    refuse(act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu",
           "GPT-2 with activation_function " + act + " (megatrain's GELU is the tanh form, gelu_new, or the erf form, gelu)");
    refuse(!field<bool>(hc, "scale_attn_weights", true) || field<bool>(hc, "scale_attn_by_inverse_layer_idx", false),
           "GPT-2 attention scaled otherwise than by 1/sqrt(head dim) (scale_attn_weights false or scale_attn_by_inverse_layer_idx)");
    flags << "--num-layers " << hc.at("n_layer").get<int64_t>() << " --hidden-size " << h << " --num-attention-heads " << hc.at("n_head").get<int64_t>()
          << " --ffn-hidden-size " << field<int64_t>(hc, "n_inner", 4 * h) << " --max-position-embeddings " << pos << " --seq-length " << pos
          << " --norm-epsilon " << field<double>(hc, "layer_norm_epsilon", 1e-5) << " --position-embedding-type learned_absolute";
    if (!field<bool>(hc, "tie_word_embeddings", true)) flags << " --untie-embeddings-and-output-weights";
    if (act == "gelu") flags << " --no-bias-gelu-fusion";  // (HF's exact GELU: Megatron's without the bias-GELU fusion)
  } else if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "MixtralForCausalLM" || arch == "Qwen2ForCausalLM" ||
             arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM" || arch == "Qwen2MoeForCausalLM" || arch == "Glm4MoeForCausalLM" ||
             arch == "GptOssForCausalLM" || arch == "DeepseekV3ForCausalLM") {
    family = arch == "MixtralForCausalLM"    ? "mixtral"
             : arch == "DeepseekV3ForCausalLM" ? "deepseek_v3"
             : arch == "GptOssForCausalLM"   ? "gpt_oss"
             : arch == "Glm4MoeForCausalLM"  ? "glm4_moe"
             : arch == "Qwen3ForCausalLM"    ? "qwen3"
             : arch == "Qwen3MoeForCausalLM" ? "qwen3_moe"
             : arch == "Qwen2MoeForCausalLM" ? "qwen2_moe"
                                             : "llama";
    const bool qwen3 = family == "qwen3" || family == "qwen3_moe";
    // Quantized checkpoints, dequantized to fp32 on import (training updates them in full precision; an export writes them
    // unquantized): quant_method "mxfp4" (GPT-OSS's experts, HfWeights::take_experts, as transformers' Mxfp4Config(dequantize=
    // True)) and "fp8" (DeepSeek-V3's: E4M3 linear weights in blocks of weight_block_size, each times its weight_scale_inv).
    const json quant = hc.value("quantization_config", json());
    if (quant.is_object() && !quant.empty()) {
      const std::string method = field<std::string>(quant, "quant_method", "?");
      refuse(method != "mxfp4" && method != "fp8", "quantization_config's quant_method " + method + " (megatrain reads mxfp4 and fp8 "
                                                   "checkpoints and unquantized ones): dequantize the model first (transformers: load it "
                                                   "dequantized, then save_pretrained)");
      refuse(method == "mxfp4" && family != "gpt_oss", "quant_method mxfp4 outside GPT-OSS (megatrain reads MXFP4 experts in GptOssForCausalLM)");
      if (method == "fp8") {
        refuse(field<std::string>(quant, "fmt", "e4m3") != "e4m3", "quant_method fp8 with fmt " + field<std::string>(quant, "fmt", "") + " (megatrain "
                                                                     "reads e4m3 weights)");
        const json block = quant.value("weight_block_size", json::array({128, 128}));
        refuse(!block.is_array() || block.size() != 2 || block[0].get<int64_t>() < 1 || block[1].get<int64_t>() < 1,
               "quant_method fp8 without a weight_block_size of two positive sizes (megatrain reads block-scaled FP8 weights)");
        fp8_blocks = {block[0].get<int64_t>(), block[1].get<int64_t>()};
      }
    }
    const int64_t h = hc.at("hidden_size").get<int64_t>(), nh = hc.at("num_attention_heads").get<int64_t>();
    const int64_t ng = field<int64_t>(hc, "num_key_value_heads", nh), pos = hc.at("max_position_embeddings").get<int64_t>();
    const bool gpt_oss = family == "gpt_oss";
    // RoPE scaling, in rope_scaling or (newer configs) rope_parameters: LLaMA 3.1's with Megatron's fixed factors
    // (--use-rope-scaling), linear position interpolation by a whole factor (--rotary-seq-len-interpolation-factor), or
    // YaRN (--position-embedding-type yarn: HF's factor, original length, betas and truncate, its attention factor the
    // default 0.1 ln(factor) + 1 or DeepSeek's mscale / mscale_all_dim ratio). GPT-OSS's default is its YaRN.
    std::string rope_scaling_flags, rope_type = "rope";
    auto rope_scaling = [&](const json& rs) {
      const std::string type = field<std::string>(rs, "rope_type", field<std::string>(rs, "type", "default"));
      if (type == "default") return;
      std::ostringstream f;
      f << std::setprecision(17);
      if (type == "yarn") {
        const double factor = field<double>(rs, "factor", 1.0);
        refuse(!(factor > 0), "rope_scaling yarn with factor " + std::to_string(factor));
        const auto original = field<int64_t>(rs, "original_max_position_embeddings", hc.at("max_position_embeddings").get<int64_t>());
        const double mscale = field<double>(rs, "mscale", 0.0), mscale_all_dim = field<double>(rs, "mscale_all_dim", 0.0);
        RopeScaling y{.yarn_factor = factor};
        if (mscale != 0.0 && mscale_all_dim != 0.0) {  // (HF takes their ratio only when both are given)
          y.yarn_mscale = mscale;
          y.yarn_mscale_all_dim = mscale_all_dim;
        }
        if (rs.contains("attention_factor") && !rs["attention_factor"].is_null()) {  // (an explicit one: Megatron's --mscale over mscale_all_dim 0)
          const double given = rs["attention_factor"].get<double>();
          refuse(y.yarn_mscale_all_dim != 0.0 && std::fabs(given - rope_attention_factor(y)) > 1e-9 * std::max(1.0, given),
                 "rope_scaling yarn with an attention_factor beside mscale and mscale_all_dim that disagrees with them");
          refuse(factor <= 1.0 && given != 1.0, "rope_scaling yarn with factor <= 1 and an attention_factor other than 1 (Megatron's is 1 there)");
          if (y.yarn_mscale_all_dim == 0.0 && factor > 1.0) y.yarn_mscale = (given - 1.0) / (0.1 * std::log(factor));
        }
        rope_type = "yarn";
        f << " --rotary-scaling-factor " << factor << " --yarn-original-max-position-embeddings " << original << " --yarn-beta-fast "
          << field<double>(rs, "beta_fast", 32.0) << " --yarn-beta-slow " << field<double>(rs, "beta_slow", 1.0);
        if (y.yarn_mscale_all_dim != 0.0 || y.yarn_mscale != 1.0) f << " --mscale " << y.yarn_mscale << " --mscale-all-dim " << y.yarn_mscale_all_dim;
        if (!field<bool>(rs, "truncate", true)) f << " --no-yarn-correction-range-round-to-int";
      } else if (type == "linear") {
        const double factor = field<double>(rs, "factor", 1.0);
        refuse(!(factor >= 1) || factor != std::floor(factor),
               "rope_scaling linear with factor " + std::to_string(factor) + " (Megatron's --rotary-seq-len-interpolation-factor is a whole number >= 1)");
        f << " --rotary-seq-len-interpolation-factor " << static_cast<int64_t>(factor);
      } else {
        const RopeScaling fixed;
        refuse(type != "llama3" || field<double>(rs, "low_freq_factor", 0) != fixed.low_freq_factor ||
                   field<double>(rs, "high_freq_factor", 0) != fixed.high_freq_factor ||
                   field<double>(rs, "original_max_position_embeddings", 0) != fixed.original_max_positions,
               "rope scaling of rope_type " + type + " (megatrain has LLaMA 3.1's llama3 with low 1, high 4, original 8192, linear and yarn)");
        f << " --use-rope-scaling --rope-scaling-factor " << field<double>(rs, "factor", 8.0);
      }
      rope_scaling_flags = f.str();
    };
    const bool rope_given = !hc.value("rope_scaling", json()).is_null() || (hc.contains("rope_parameters") && hc["rope_parameters"].is_object());
    if (gpt_oss && !rope_given) {  // (GptOssConfig's default)
      rope_scaling(json{{"rope_type", "yarn"}, {"factor", 32.0}, {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"truncate", false},
                        {"original_max_position_embeddings", 4096}});
    }
    if (!hc.value("rope_scaling", json()).is_null()) rope_scaling(hc["rope_scaling"]);
    // Newer configs hold RoPE's settings in rope_parameters: {"rope_type": "default", "rope_theta": ...}.
    double rope_theta = field<double>(hc, "rope_theta", gpt_oss ? 150000.0 : 10000.0);
    // (GLM-4.5's: RoPE on the first part of each head; HF's Glm4MoeConfig defaults it to 0.5)
    double partial_rotary = field<double>(hc, "partial_rotary_factor", family == "glm4_moe" ? 0.5 : 1.0);
    if (hc.contains("rope_parameters") && hc["rope_parameters"].is_object()) {
      const json& rp = hc["rope_parameters"];
      rope_scaling(rp);
      rope_theta = field<double>(rp, "rope_theta", rope_theta);
      partial_rotary = field<double>(rp, "partial_rotary_factor", partial_rotary);
    }
    refuse(family != "glm4_moe" && partial_rotary != 1.0, arch + " with partial_rotary_factor (its modeling code rotates whole heads)");
    {
      const int64_t head = field<int64_t>(hc, "head_dim", hc.at("hidden_size").get<int64_t>() / hc.at("num_attention_heads").get<int64_t>());
      const auto rotated = static_cast<int64_t>(static_cast<double>(head) * partial_rotary);
      refuse(rotated % 2 != 0, "partial_rotary_factor rotating an odd " + std::to_string(rotated) + " channels of each head (megatrain rotates pairs)");
    }
    refuse(!gpt_oss && field<std::string>(hc, "hidden_act", "silu") != "silu", "hidden_act " + field<std::string>(hc, "hidden_act", "") + " (SwiGLU needs silu)");
    // Sliding-window attention: HF's sliding_window W lets query i attend to keys i - W + 1 .. i (its mask keeps
    // kv > q - W), megatrain's --window-size W-1,0. Which layers: Mistral's and Mixtral's every layer; Qwen's only with
    // use_sliding_window (off in their released configs; HF leaves sliding_window unset without it): Qwen3-MoE's every
    // layer (one mask for the model), Qwen2's and Qwen3's those layer_types names "sliding_attention", else those from
    // max_window_layers on; Qwen2-MoE's without layer_types is refused (its layers are not pinned down). LLaMA's and GLM's
    // modeling code has no window.
    const bool qwen2_moe = family == "qwen2_moe", qwen2 = arch == "Qwen2ForCausalLM" || qwen2_moe;
    const int64_t layers = hc.at("num_hidden_layers").get<int64_t>();
    std::vector<bool> window_layers(static_cast<size_t>(layers), false);
    const json layer_types = hc.value("layer_types", json::array());
    const bool qwen_window = (qwen2 || qwen3) && field<bool>(hc, "use_sliding_window", false);
    if (arch == "MistralForCausalLM" || arch == "MixtralForCausalLM" || (qwen_window && family == "qwen3_moe")) {
      std::fill(window_layers.begin(), window_layers.end(), true);
    } else if (gpt_oss && (!layer_types.is_array() || layer_types.empty())) {  // (GptOssConfig's default: even layers windowed)
      for (int64_t l = 0; l < layers; l += 2) window_layers[static_cast<size_t>(l)] = true;
    } else if ((qwen_window || gpt_oss) && layer_types.is_array() && !layer_types.empty()) {
      refuse(static_cast<int64_t>(layer_types.size()) != layers, "layer_types lists " + std::to_string(layer_types.size()) + " layers, not num_hidden_layers");
      for (size_t l = 0; l < layer_types.size(); ++l) {
        const std::string t = layer_types[l].is_string() ? layer_types[l].get<std::string>() : "";
        refuse(t != "sliding_attention" && t != "full_attention", "layer_types entry '" + t + "' (megatrain has full_attention and sliding_attention)");
        window_layers[l] = t == "sliding_attention";
      }
    } else if (qwen_window) {
      refuse(qwen2_moe, "Qwen2-MoE's use_sliding_window without layer_types (its windowed layers are not pinned down)");
      for (int64_t l = std::max<int64_t>(0, field<int64_t>(hc, "max_window_layers", 0)); l < layers; ++l) window_layers[static_cast<size_t>(l)] = true;
    }
    const bool any_window = std::find(window_layers.begin(), window_layers.end(), true) != window_layers.end();
    const int64_t window = any_window ? field<int64_t>(hc, "sliding_window", gpt_oss ? 128 : 0) : 0;
    std::string window_flags;
    if (window > 0 && window < pos) {
      window_flags = " --window-size " + std::to_string(window - 1) + ",0";
      if (std::find(window_layers.begin(), window_layers.end(), false) != window_layers.end()) {
        window_flags += " --window-attn-skip-freq [";
        for (size_t l = 0; l < window_layers.size(); ++l) window_flags += std::string(l ? "," : "") + (window_layers[l] ? "1" : "0");
        window_flags += "]";
      }
    }
    // (Qwen2's QKV layers always have biases, its o_proj and MLP none: --add-qkv-bias)
    // (Qwen2-MoE's: qkv_bias, true in its released configs)
    const bool deepseek = family == "deepseek_v3", glm = family == "glm4_moe" || deepseek;  // (DeepSeek-V3's MoE block is GLM-4.5's)
    const bool attn_bias = qwen2_moe ? field<bool>(hc, "qkv_bias", true) : qwen2 || field<bool>(hc, "attention_bias", gpt_oss);
    // (GPT-OSS's router and experts always have biases: megatrain's biases come together, so its attention must have them too)
    const bool mlp_bias = gpt_oss || (!qwen2 && !glm && field<bool>(hc, "mlp_bias", false));
    refuse(gpt_oss && !attn_bias, "GPT-OSS without attention_bias (its router and experts have biases; megatrain's --disable-bias-linear "
                                  "covers every linear layer)");
    // attention_bias without mlp_bias (LlamaForCausalLM's, as megatrain exports --add-qkv-bias): the QKV biases alone, if
    // o_proj's biases are zeros (checked with the weights). Mistral and Mixtral have no biases.
    refuse(!attn_bias && mlp_bias, "mlp_bias without attention_bias (megatrain's --disable-bias-linear covers both)");
    refuse(attn_bias && arch != "LlamaForCausalLM" && !qwen2 && !qwen3 && !(glm && !deepseek) && !gpt_oss, arch + " with attention_bias (megatrain's MLA "
           "and the family's modeling have no biases there)");
    flags << "--num-layers " << hc.at("num_hidden_layers").get<int64_t>() << " --hidden-size " << h << " --num-attention-heads " << nh;
    if (deepseek) {
      // DeepseekV3Attention: multi-latent attention (HF's qk_nope_head_dim is Megatron's --qk-head-dim); its latents' RMSNorms
      // at eps 1e-6 whatever rms_norm_eps, RoPE's pairs gathered to halves (rope_interleave: Megatron's MLA RoPE), no biases.
      refuse(hc.contains("q_lora_rank") && hc["q_lora_rank"].is_null(), "DeepseekV3ForCausalLM without q_lora_rank (DeepSeek-V2-Lite's form: the keys' latent "
                                                        "normed alone, which Megatron's MLA cannot express)");
      refuse(!field<bool>(hc, "rope_interleave", true), "DeepseekV3ForCausalLM with rope_interleave false (Megatron's MLA gathers RoPE's pairs)");
      refuse(field<double>(hc, "rms_norm_eps", 1e-6) != 1e-6, "DeepseekV3ForCausalLM with rms_norm_eps other than 1e-6 (its latents' norms keep "
                                                              "1e-6; megatrain's --norm-epsilon is one for all)");
      refuse(ng != nh, "DeepseekV3ForCausalLM with num_key_value_heads other than num_attention_heads");
      const json rs = hc.value("rope_scaling", json()).is_object() ? hc["rope_scaling"] : hc.value("rope_parameters", json());
      refuse(rs.is_object() && field<double>(rs, "mscale_all_dim", 0.0) != 0.0 && field<double>(rs, "mscale", 0.0) == 0.0,
             "DeepseekV3ForCausalLM with rope_scaling's mscale_all_dim and no mscale (its softmax scale takes mscale_all_dim, its RoPE not: "
             "Megatron's MLA takes both or neither)");
      flags << " --multi-latent-attention --q-lora-rank " << field<int64_t>(hc, "q_lora_rank", 1536) << " --kv-lora-rank "
            << field<int64_t>(hc, "kv_lora_rank", 512) << " --qk-head-dim " << field<int64_t>(hc, "qk_nope_head_dim", 128) << " --qk-pos-emb-head-dim "
            << field<int64_t>(hc, "qk_rope_head_dim", 64) << " --v-head-dim " << field<int64_t>(hc, "v_head_dim", 128) << " --qk-layernorm --rope-type "
            << rope_type;
    } else {
      flags << " --group-query-attention --num-query-groups " << ng << " --kv-channels " << field<int64_t>(hc, "head_dim", qwen3 ? 128 : h / nh);
    }
    flags << " --ffn-hidden-size " << hc.at("intermediate_size").get<int64_t>() << " --max-position-embeddings " << pos << " --seq-length "
          << pos << " --normalization RMSNorm --norm-epsilon " << field<double>(hc, "rms_norm_eps", family == "glm4_moe" || gpt_oss ? 1e-5 : 1e-6)
          << (gpt_oss ? "" : " --swiglu") << " --position-embedding-type " << (deepseek ? "rope" : rope_type) << " --rotary-base " << rope_theta
          << rope_scaling_flags << window_flags;
    if (partial_rotary != 1.0) flags << " --rotary-percent " << partial_rotary;
    if (!attn_bias || !mlp_bias) flags << " --disable-bias-linear";
    if (attn_bias && !mlp_bias) flags << " --add-qkv-bias";
    if (!field<bool>(hc, "tie_word_embeddings", false)) flags << " --untie-embeddings-and-output-weights";
    if (qwen3 || (glm && !deepseek && field<bool>(hc, "use_qk_norm", false))) flags << " --qk-layernorm";  // (RMSNorms of each query and key head before RoPE)
    if (glm) {
      // Glm4MoeMoE in layer l from first_k_dense_replace on: sigmoid scores, e_score_correction_bias added for the choice
      // (megatrain's expert bias), groups scored by their best two experts, the top k renormalised (norm_topk_prob) and
      // scaled (routed_scaling_factor), plus n_shared_experts ungated shared experts.
      // (where config.json leaves a key out, the family's config class default: Glm4MoeConfig's, or DeepseekV3Config's)
      const int64_t L = hc.at("num_hidden_layers").get<int64_t>(), dense = field<int64_t>(hc, "first_k_dense_replace", deepseek ? 3 : 1);
      const int64_t topk = field<int64_t>(hc, "num_experts_per_tok", 8), groups = field<int64_t>(hc, "n_group", deepseek ? 8 : 1);
      const int64_t group_topk = field<int64_t>(hc, "topk_group", deepseek ? 4 : 1), shared = field<int64_t>(hc, "n_shared_experts", 1);
      // (megatrain's sigmoid router renormalises the top k, and at top-1 weighs by the score)
      const bool renormalised = field<bool>(hc, "norm_topk_prob", true);
      refuse(!renormalised && topk > 1, arch + " without norm_topk_prob above top-1 (megatrain's sigmoid router renormalises the top k)");
      refuse(renormalised && topk == 1, arch + " at num_experts_per_tok 1 with norm_topk_prob (its weight is 1; megatrain's sigmoid router "
                                        "weighs by the score)");
      refuse(groups > group_topk && (group_topk < 1 || topk / group_topk != 2 || topk % group_topk != 0),
             arch + "'s groups score by their best two experts: n_group > topk_group needs num_experts_per_tok = 2 x topk_group");
      std::string pattern = "[";
      for (int64_t l = 0; l < L; ++l) pattern += std::string(l ? "," : "") + (l >= dense ? "1" : "0");
      pattern += "]";
      flags << " --num-experts " << hc.at("n_routed_experts").get<int64_t>() << " --moe-router-topk " << topk << " --moe-ffn-hidden-size "
            << hc.at("moe_intermediate_size").get<int64_t>() << " --moe-layer-freq " << pattern
            << " --moe-router-score-function sigmoid --moe-router-enable-expert-bias";
      const double scaling = field<double>(hc, "routed_scaling_factor", deepseek ? 2.5 : 1.0);
      if (scaling != 1.0) flags << " --moe-router-topk-scaling-factor " << scaling;
      if (groups > group_topk) flags << " --moe-router-num-groups " << groups << " --moe-router-group-topk " << group_topk;  // (else none masked)
      if (shared > 0) flags << " --moe-shared-expert-intermediate-size " << shared * hc.at("moe_intermediate_size").get<int64_t>();
    }
    if (glm) {  // multi-token prediction's layers (model.layers.{L + k}), where the checkpoint holds them whole (HF's own saves leave them
                // out: then, or with a part of one, left out with a note below)
      const int64_t L = hc.at("num_hidden_layers").get<int64_t>(), nextn = field<int64_t>(hc, "num_nextn_predict_layers", 0);
      const HfWeights& probe = open_weights();
      bool whole = nextn > 0;
      for (int64_t k = 0; whole && k < nextn; ++k) {
        const std::string o = "model.layers." + std::to_string(L + k) + ".";
        for (const char* t : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "input_layernorm.weight"}) {
          whole = whole && probe.has(o + t);
        }
      }
      if (whole) flags << " --mtp-num-layers " << nextn;
    }
    if (family == "qwen3_moe" || qwen2_moe) {
      // Qwen3MoeSparseMoeBlock (Qwen2MoeSparseMoeBlock) in layer l unless l is in mlp_only_layers, where (l + 1) % decoder_sparse_step == 0 (an
      // explicit --moe-layer-freq list); its softmax over the experts with the top k renormalised (norm_topk_prob:
      // Megatron's softmax over the top-k logits) or not (--moe-router-pre-softmax).
      const int64_t L = hc.at("num_hidden_layers").get<int64_t>(), step = field<int64_t>(hc, "decoder_sparse_step", 1);
      refuse(step < 1, "decoder_sparse_step below 1");
      std::set<int64_t> dense;
      for (const auto& x : hc.value("mlp_only_layers", json::array())) dense.insert(x.get<int64_t>());
      std::string pattern = "[";
      for (int64_t l = 0; l < L; ++l) pattern += std::string(l ? "," : "") + ((dense.count(l) == 0 && (l + 1) % step == 0) ? "1" : "0");
      pattern += "]";
      flags << " --num-experts " << hc.at("num_experts").get<int64_t>() << " --moe-router-topk " << hc.at("num_experts_per_tok").get<int64_t>()
            << " --moe-ffn-hidden-size " << hc.at("moe_intermediate_size").get<int64_t>() << " --moe-aux-loss-coeff "
            << field<double>(hc, "router_aux_loss_coef", 0.0) << " --moe-layer-freq " << pattern;
      if (!field<bool>(hc, "norm_topk_prob", false)) flags << " --moe-router-pre-softmax";
      refuse(field<bool>(hc, "norm_topk_prob", false) && hc.at("num_experts_per_tok").get<int64_t>() == 1, kTopOneRenormalised);
      // Qwen2-MoE's shared expert, its output times sigmoid(shared_expert_gate . x)
      // (HF's default 5632 where config.json leaves it out; its block always has the shared expert and the gate)
      if (qwen2_moe) {
        const int64_t shared = field<int64_t>(hc, "shared_expert_intermediate_size", 5632);
        refuse(shared < 1, "Qwen2-MoE with shared_expert_intermediate_size " + std::to_string(shared) + " (its block always has a shared expert)");
        flags << " --moe-shared-expert-intermediate-size " << shared << " --moe-shared-expert-gate";
      }
    }
    if (gpt_oss) {
      // GptOssMLP in every layer: a router with a bias, the top k of its logits softmaxed (Megatron's softmax over the top-k
      // logits), each expert's gate_up_proj (gate and up interleaved) with biases, then quick GELU of the gate clamped at
      // swiglu_limit times (up clamped + 1): --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value; attention
      // sinks per head: --softmax-type learnable.
      // (the released checkpoints hold the experts' weights in MXFP4: see quantization_config above)
      const double alpha = field<double>(hc, "swiglu_alpha", 1.702), limit = field<double>(hc, "swiglu_limit", 7.0);
      refuse(static_cast<float>(alpha) != kQuickGeluAlpha, "GPT-OSS with swiglu_alpha " + std::to_string(alpha) + " (Megatron's quick GELU is 1.702)");
      refuse(!(limit > 0), "GPT-OSS with swiglu_limit " + std::to_string(limit) + " (the clamp must be positive)");
      refuse(hc.at("num_experts_per_tok").get<int64_t>() == 1, kTopOneRenormalised);
      flags << " --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value " << limit << " --softmax-type learnable --num-experts "
            << hc.at("num_local_experts").get<int64_t>() << " --moe-router-topk " << hc.at("num_experts_per_tok").get<int64_t>()
            << " --moe-ffn-hidden-size " << hc.at("intermediate_size").get<int64_t>() << " --moe-aux-loss-coeff "
            << field<double>(hc, "router_aux_loss_coef", 0.001);
    }
    if (family == "mixtral") {
      refuse(hc.at("num_experts_per_tok").get<int64_t>() == 1, kTopOneRenormalised);
      flags << " --num-experts " << hc.at("num_local_experts").get<int64_t>() << " --moe-router-topk " << hc.at("num_experts_per_tok").get<int64_t>()
            << " --moe-ffn-hidden-size " << hc.at("intermediate_size").get<int64_t>() << " --moe-aux-loss-coeff "
            << field<double>(hc, "router_aux_loss_coef", 0.0);
    }
  } else {
    throw ConfigError("cannot import " + (arch.empty() ? std::string("a model without \"architectures\"") : arch) +
                      ": megatrain imports GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
                      "Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM, Glm4MoeForCausalLM, GptOssForCausalLM and DeepseekV3ForCausalLM");
  }
  const int64_t V = hc.at("vocab_size").get<int64_t>();
  flags << " --vocab-size " << V << " --make-vocab-size-divisible-by 1";
  const std::string flag_text = flags.str();
  CLI::App app;
  ConfigCli cli(app);
  app.parse(flag_text, false);
  Config c = cli.build();
  const Diagnostics dg = validate(c, 1, Purpose::kPrint);
  if (!dg.ok()) throw ConfigError("config.json gives an invalid model: " + dg.errors.front());
  resolve(c, 1);
  const ModelDims D = model_dims(c, 0, 1);
  GPTModel model(c, ProcessGroups::single());
  ParamStore& ps = model.params();
  HfWeights& hf = open_weights();
  hf.set_base_prefix(family == "gpt2" ? "transformer." : "model.");
  hf.set_fp8_blocks(fp8_blocks.first, fp8_blocks.second);
  auto set = [&](const std::string& name, const Values& v) {
    const size_t i = ps.index_of(name);
    if (i == kNoParam) throw std::logic_error("import: megatrain's model has no " + name);
    if (static_cast<int64_t>(v.size()) != ps.info(i).numel) throw std::logic_error("import: size of " + name);
    std::memcpy(ps.param(i), v.data(), v.size() * sizeof(float));
  };
  const int64_t L = D.L, h = D.h, nh = D.nh, ng = D.ng, d = D.d;
  const std::vector<bool> moe = moe_layer_pattern(c);
  if (family == "gpt2") {
    set("embedding.word_embeddings.weight", hf.take("transformer.wte.weight", {V, h}));
    set("embedding.position_embeddings.weight", hf.take("transformer.wpe.weight", {D.max_pos, h}));
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".", o = "transformer.h." + std::to_string(l) + ".";
      set(p + "input_norm.weight", hf.take(o + "ln_1.weight", {h}));
      set(p + "input_norm.bias", hf.take(o + "ln_1.bias", {h}));
      const Values w = transposed(hf.take(o + "attn.c_attn.weight", {h, 3 * h}), h, 3 * h);  // [3h, h]: Q, K, V rows
      const auto third = [&](const Values& x, int64_t k, int64_t cols) { return Values(x.begin() + k * h * cols, x.begin() + (k + 1) * h * cols); };
      set(p + "attention.qkv.weight", merge_qkv(third(w, 0, h), third(w, 1, h), third(w, 2, h), nh, ng, d, h));
      const Values b = hf.take(o + "attn.c_attn.bias", {3 * h});
      set(p + "attention.qkv.bias", merge_qkv(third(b, 0, 1), third(b, 1, 1), third(b, 2, 1), nh, ng, d, 1));
      set(p + "attention.proj.weight", transposed(hf.take(o + "attn.c_proj.weight", {h, h}), h, h));
      set(p + "attention.proj.bias", hf.take(o + "attn.c_proj.bias", {h}));
      set(p + "mlp_norm.weight", hf.take(o + "ln_2.weight", {h}));
      set(p + "mlp_norm.bias", hf.take(o + "ln_2.bias", {h}));
      set(p + "mlp.fc1.weight", transposed(hf.take(o + "mlp.c_fc.weight", {h, D.F}), h, D.F));
      set(p + "mlp.fc1.bias", hf.take(o + "mlp.c_fc.bias", {D.F}));
      set(p + "mlp.fc2.weight", transposed(hf.take(o + "mlp.c_proj.weight", {D.F, h}), D.F, h));
      set(p + "mlp.fc2.bias", hf.take(o + "mlp.c_proj.bias", {h}));
    }
    set("final_norm.weight", hf.take("transformer.ln_f.weight", {h}));
    set("final_norm.bias", hf.take("transformer.ln_f.bias", {h}));
    if (!D.tied) set("output_layer.weight", hf.take("lm_head.weight", {V, h}));
  } else {
    set("embedding.word_embeddings.weight", hf.take("model.embed_tokens.weight", {V, h}));
    // (and multi-token prediction's modules' layers, model.layers.{L + k}, each of the last layer's kind)
    for (int64_t l = 0; l < L + D.mtp; ++l) {
      const std::string p = l < L ? "layers." + std::to_string(l) + "." : "mtp." + std::to_string(l - L) + ".layer.";
      const std::string o = "model.layers." + std::to_string(l) + ".";
      set(p + "input_norm.weight", hf.take(o + "input_layernorm.weight", {h}));
      if (D.mla) {  // DeepSeek-V3's multi-latent attention: HF's tensors are Megatron's as they are
        const int64_t Rq = D.q_lora_rank, Rkv = D.kv_lora_rank;
        set(p + "attention.q_down_proj.weight", hf.take(o + "self_attn.q_a_proj.weight", {Rq, h}));
        set(p + "attention.q_layernorm.weight", hf.take(o + "self_attn.q_a_layernorm.weight", {Rq}));
        set(p + "attention.q_up_proj.weight", hf.take(o + "self_attn.q_b_proj.weight", {nh * d, Rq}));
        set(p + "attention.kv_down_proj.weight", hf.take(o + "self_attn.kv_a_proj_with_mqa.weight", {Rkv + D.qk_rope, h}));
        set(p + "attention.kv_layernorm.weight", hf.take(o + "self_attn.kv_a_layernorm.weight", {Rkv}));
        set(p + "attention.kv_up_proj.weight", hf.take(o + "self_attn.kv_b_proj.weight", {nh * (D.qk_nope + D.v_dim), Rkv}));
        set(p + "attention.proj.weight", hf.take(o + "self_attn.o_proj.weight", {h, nh * D.v_dim}));
      } else {
      set(p + "attention.qkv.weight", merge_qkv(hf.take(o + "self_attn.q_proj.weight", {nh * d, h}), hf.take(o + "self_attn.k_proj.weight", {ng * d, h}),
                                                hf.take(o + "self_attn.v_proj.weight", {ng * d, h}), nh, ng, d, h));
      set(p + "attention.proj.weight", hf.take(o + "self_attn.o_proj.weight", {h, nh * d}));
      if (D.qkv_bias) {
        set(p + "attention.qkv.bias", merge_qkv(hf.take(o + "self_attn.q_proj.bias", {nh * d}), hf.take(o + "self_attn.k_proj.bias", {ng * d}),
                                                hf.take(o + "self_attn.v_proj.bias", {ng * d}), nh, ng, d, 1));
        // (Qwen2's o_proj has no bias tensor; LLaMA's attention_bias gives it one, which must be zeros here. Its name with
        // or without the base model's "model.")
        const bool o_has = hf.has(o + "self_attn.o_proj.bias") || hf.has(o.substr(6) + "self_attn.o_proj.bias");
        const auto o_bias = D.bias || o_has ? hf.take(o + "self_attn.o_proj.bias", {h}) : Values{};
        if (D.bias) {
          set(p + "attention.proj.bias", o_bias);
        } else if (std::any_of(o_bias.begin(), o_bias.end(), [](float x) { return x != 0.0f; })) {
          throw ConfigError("cannot import: " + o + "self_attn.o_proj.bias is not zero, and the model has attention_bias without mlp_bias (megatrain's "
                            "--add-qkv-bias biases only the QKV layers): such a model cannot be imported");
        }
      }
      }
      if (family == "gpt_oss") set(p + "attention.softmax_offset", hf.take(o + "self_attn.sinks", {nh}));
      if (D.qk_norm && !D.mla) {
        set(p + "attention.q_norm.weight", hf.take(o + "self_attn.q_norm.weight", {d}));
        set(p + "attention.k_norm.weight", hf.take(o + "self_attn.k_norm.weight", {d}));
      }
      set(p + "mlp_norm.weight", hf.take(o + "post_attention_layernorm.weight", {h}));
      if (family == "llama" || family == "qwen3" ||
          ((family == "qwen3_moe" || family == "qwen2_moe" || family == "glm4_moe" || family == "deepseek_v3") && !moe[static_cast<size_t>(std::min(l, L - 1))])) {
        set(p + "mlp.fc1_gate.weight", hf.take(o + "mlp.gate_proj.weight", {D.F, h}));
        set(p + "mlp.fc1_up.weight", hf.take(o + "mlp.up_proj.weight", {D.F, h}));
        set(p + "mlp.fc2.weight", hf.take(o + "mlp.down_proj.weight", {h, D.F}));
        if (D.bias) {
          set(p + "mlp.fc1_gate.bias", hf.take(o + "mlp.gate_proj.bias", {D.F}));
          set(p + "mlp.fc1_up.bias", hf.take(o + "mlp.up_proj.bias", {D.F}));
          set(p + "mlp.fc2.bias", hf.take(o + "mlp.down_proj.bias", {h}));
        }
        continue;
      }
      if (family == "gpt_oss") {  // (the experts' tensors stacked, [in, out] each, gate and up interleaved in gate_up_proj's columns)
        set(p + "mlp.router.weight", hf.take(o + "mlp.router.weight", {D.experts, h}));
        set(p + "mlp.router.bias", hf.take(o + "mlp.router.bias", {D.experts}));
        const int64_t F = D.F_moe;
        const Values gate_up = hf.take_experts(o + "mlp.experts.gate_up_proj", D.experts, h, 2 * F);
        const Values gate_up_b = hf.take(o + "mlp.experts.gate_up_proj_bias", {D.experts, 2 * F});
        const Values down = hf.take_experts(o + "mlp.experts.down_proj", D.experts, F, h);
        const Values down_b = hf.take(o + "mlp.experts.down_proj_bias", {D.experts, h});
        for (int64_t e = 0; e < D.experts; ++e) {
          const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
          Values gate(static_cast<size_t>(F * h)), up(gate.size()), gate_b(static_cast<size_t>(F)), up_b(gate_b.size());
          for (int64_t j = 0; j < F; ++j) {
            for (int64_t i = 0; i < h; ++i) {
              gate[static_cast<size_t>(j * h + i)] = gate_up[static_cast<size_t>((e * h + i) * 2 * F + 2 * j)];
              up[static_cast<size_t>(j * h + i)] = gate_up[static_cast<size_t>((e * h + i) * 2 * F + 2 * j + 1)];
            }
            gate_b[static_cast<size_t>(j)] = gate_up_b[static_cast<size_t>(e * 2 * F + 2 * j)];
            up_b[static_cast<size_t>(j)] = gate_up_b[static_cast<size_t>(e * 2 * F + 2 * j + 1)];
          }
          set(x + "fc1_gate.weight", gate);
          set(x + "fc1_up.weight", up);
          set(x + "fc1_gate.bias", gate_b);
          set(x + "fc1_up.bias", up_b);
          set(x + "fc2.weight", transposed(Values(down.begin() + e * F * h, down.begin() + (e + 1) * F * h), F, h));
          set(x + "fc2.bias", Values(down_b.begin() + e * h, down_b.begin() + (e + 1) * h));
        }
        continue;
      }
      const bool glm_moe = family == "glm4_moe" || family == "deepseek_v3";  // (DeepSeek-V3's MoE block is GLM-4.5's)
      const HfMoeNames hn = hf_moe_names(family == "qwen3_moe" || family == "qwen2_moe" || glm_moe);
      set(p + "mlp.router.weight", hf.take(o + hn.block + "gate.weight", {D.experts, h}));
      if (glm_moe) set(p + "mlp.router.expert_bias", hf.take(o + "mlp.gate.e_score_correction_bias", {D.experts}));
      for (int64_t e = 0; e < D.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".", y = o + hn.block + "experts." + std::to_string(e) + ".";
        set(x + "fc1_gate.weight", hf.take(y + hn.gate + ".weight", {D.F_moe, h}));
        set(x + "fc1_up.weight", hf.take(y + hn.up + ".weight", {D.F_moe, h}));
        set(x + "fc2.weight", hf.take(y + hn.down + ".weight", {h, D.F_moe}));
      }
      if (D.F_shared > 0) {  // (Qwen2-MoE's, with its gate; GLM-4.5's, ungated)
        const std::string x = p + "mlp.shared_experts.", y = o + (glm_moe ? "mlp.shared_experts." : "mlp.shared_expert.");
        set(x + "fc1_gate.weight", hf.take(y + "gate_proj.weight", {D.F_shared, h}));
        set(x + "fc1_up.weight", hf.take(y + "up_proj.weight", {D.F_shared, h}));
        set(x + "fc2.weight", hf.take(y + "down_proj.weight", {h, D.F_shared}));
        if (family == "qwen2_moe") set(x + "gate.weight", hf.take(o + "mlp.shared_expert_gate.weight", {1, h}));
      }
    }
    set("final_norm.weight", hf.take("model.norm.weight", {h}));
    if (!D.tied) set("output_layer.weight", hf.take("lm_head.weight", {V, h}));
    // The modules' own tensors; their copies of the embedding and output layer must be the model's (megatrain shares them, as
    // Megatron does)
    for (int64_t k = 0; k < D.mtp; ++k) {
      const std::string p = "mtp." + std::to_string(k) + ".", o = "model.layers." + std::to_string(L + k) + ".";
      set(p + "enorm.weight", hf.take(o + "enorm.weight", {h}));
      set(p + "hnorm.weight", hf.take(o + "hnorm.weight", {h}));
      set(p + "eh_proj.weight", hf.take(o + "eh_proj.weight", {h, 2 * h}));
      set(p + "final_norm.weight", hf.take(o + "shared_head.norm.weight", {h}));
      const std::string head = D.tied ? "embedding.word_embeddings.weight" : "output_layer.weight";
      for (const auto& [copy, own] : {std::pair{o + "shared_head.head.weight", head}, std::pair{o + "embed_tokens.weight", std::string("embedding.word_embeddings.weight")}}) {
        if (!hf.has(copy)) continue;
        const Values v = hf.take(copy, {V, h});
        const float* mine = ps.param(ps.index_of(own));
        if (!std::equal(v.begin(), v.end(), mine)) {
          throw ConfigError("cannot import: " + copy + " differs from the model's own (megatrain's multi-token prediction shares the embedding and "
                            "the output layer, as Megatron's): such a checkpoint cannot be imported");
        }
      }
    }
  }
  // GLM-4.5's checkpoints carry their multi-token-prediction layers as model.layers.{L..} (HF's modeling skips them too).
  int64_t skipped_layers = 0;
  const int64_t mtp_layers = family == "glm4_moe" || family == "deepseek_v3" ? field<int64_t>(hc, "num_nextn_predict_layers", 0) : 0;
  auto beyond_layers = [&](const std::string& n) {
    if (mtp_layers == 0 || n.rfind("model.layers.", 0) != 0) return false;
    const int64_t layer = std::atoll(n.c_str() + 13);
    const bool beyond = layer >= L + D.mtp && layer < L + mtp_layers;
    skipped_layers += beyond ? 1 : 0;
    return beyond;
  };
  std::vector<std::string> unused = hf.unused();
  // HF writes tied heads sometimes; rotary caches in old checkpoints: both carry nothing megatrain needs.
  unused.erase(std::remove_if(unused.begin(), unused.end(),
                              [&](const std::string& n) {
                                return (D.tied && n == "lm_head.weight") || n.find("rotary_emb.inv_freq") != std::string::npos ||
                                       n.find(".attn.bias") != std::string::npos || n.find(".attn.masked_bias") != std::string::npos ||
                                       beyond_layers(n);
                              }),
               unused.end());
  if (!unused.empty()) {
    throw DataError("the HuggingFace weights hold " + std::to_string(unused.size()) + " tensor(s) this model has no place for, e.g. " + unused.front() +
                    " (config.json and the weights disagree?)");
  }
  // The checkpoint: weights only, iteration 0 (as Megatron's converters write a release checkpoint).
  Optimizer optim(c, ps, ProcessGroups::single());
  TrainState state;
  CheckpointRank who;
  who.writes_optimizer = who.writes_expert_optimizer = false;
  auto snap = take_snapshot(c, ps, optim, state, who, false);
  auto self = ProcessGroups::single();
  write_checkpoint(opt.save_dir, *snap, *self.checkpoint);
  std::vector<std::string> out;
  out.push_back("imported " + dir.string() + " (" + arch + ") into " + opt.save_dir + " at iteration 0, weights only");
  out.push_back("the model's flags: " + flag_text);
  if (hf.dequantized_fp8() > 0) {
    out.push_back("note: " + std::to_string(hf.dequantized_fp8()) + " FP8 tensor(s) (block-scaled E4M3 weights) dequantized; training updates "
                  "them in full precision, and an export writes them unquantized");
  }
  if (hf.dequantized() > 0) {
    out.push_back("note: " + std::to_string(hf.dequantized()) + " MXFP4 tensor(s) (the experts' weights) dequantized; training updates them in "
                  "full precision, and an export writes them unquantized");
  }
  if (skipped_layers > 0) {
    out.push_back("note: " + std::to_string(skipped_layers) + " tensor(s) of layers from " + std::to_string(L) +
                  " on (the multi-token-prediction layers, which megatrain does not train) left out");
  }
  out.push_back("note: train from it with --load " + opt.save_dir + " --finetune (or --no-load-optim) and these model flags (or "
                "--use-checkpoint-args); a tokenizer of " + std::to_string(V) + " tokens; under TP the vocabulary is padded to a multiple of "
                "--make-vocab-size-divisible-by x TP (zero rows)");
  return out;
}

}  // namespace

}  // namespace mt
