// gpt_cuda_setup.cpp: the CUDA model's set-up steps after its activations are allocated: the FP8 layers' cached
// weights, the attention shapes checked before the first step (and context parallelism's streams), and whether the
// TP layers split in two halves of the microbatch (gpt_cuda_split.cpp).
#include "model/cuda/gpt_cuda_state.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

// Whether cuBLASLt has the bias-gradient epilogue for a weight gradient dW[n, x_width] over k rows.
bool CudaGPT::bias_grad_fusable(int64_t n, int64_t x_width, int64_t k) const {
  return cuda::GemmLt::instance().has_algorithm(true, false, n, x_width, k, n, x_width, x_width, ab_, CUDA_R_32F,
                                                {cuda::GemmEpilogue::kBiasGrad, nullptr, 0});
}

// The FP8 layers' weights in FP8, W and W^T per site (gpt_cuda_fp8.cpp), with their inverse scales.
void CudaGPT::allocate_fp8_weights() {
  const ModelDims& D = D_;
  const int64_t h = D.h, Od = W_.Od, Wq = W_.Wq, F = W_.F, F1 = W_.F1;
  const int64_t sizes[4] = {Wq * h, h * Od, F1 * h, h * F};
  f8_wq_.assign(static_cast<size_t>(4 * L_), nullptr);
  f8_wqt_.assign(static_cast<size_t>(4 * L_), nullptr);
  for (int64_t l = 0; l < L_; ++l) {
    const int sites = layers_[static_cast<size_t>(l)].moe ? 2 : 4;  // (an MoE layer's MLP: the experts' own, below)
    for (int site = 0; fp8_layer(l) && site < sites; ++site) {
      f8_wq_[static_cast<size_t>(4 * l + site)] = static_cast<uint8_t*>(alloc(static_cast<size_t>(sizes[site])));
      f8_wqt_[static_cast<size_t>(4 * l + site)] = static_cast<uint8_t*>(alloc(static_cast<size_t>(sizes[site])));
      if (D.fp8_blockwise) {  // W [out, in] and W^T [in, out] in 128 x 128 blocks
        const int64_t outs[4] = {Wq, h, F1, h}, ins[4] = {h, Od, h, F};
        f8_wscale_.resize(static_cast<size_t>(4 * L_), nullptr);
        f8_wtscale_.resize(static_cast<size_t>(4 * L_), nullptr);
        f8_wscale_[static_cast<size_t>(4 * l + site)] = block_scales(cuda::fp8_blk128_scales(outs[site], ins[site]));
        f8_wtscale_[static_cast<size_t>(4 * l + site)] = block_scales(cuda::fp8_blk128_scales(ins[site], outs[site]));
      }
    }
  }
  f8_winv_ = static_cast<float*>(alloc(static_cast<size_t>(4 * L_ * 64) * sizeof(float)));
  if (moe_layers_ > 0) allocate_expert_fp8_weights();  // (the experts': gpt_cuda_moe_fp8.cpp)
}

// Fail here, with the shape named, rather than in the first step.
void CudaGPT::check_attention(int64_t mbs) {
  const ModelDims& D = D_;
  if (D.cp > 1) {
    // Ring or all-to-all attention (gpt_cuda_context.cpp); the rest of context parallelism's settings are refused before here.
    if (D.attention_dropout > 0) throw std::logic_error("CudaGPT: context parallelism runs without attention dropout");
    if (D.cp_a2a && (D.nh_local % D.cp != 0 || D.ng_local % D.cp != 0)) {
      throw std::runtime_error("--cp-comm-type a2a needs each TP rank's attention heads and query groups divisible by --context-parallel-size");
    }
    if (!D.cp_a2a && S_local_ % 8 != 0) {
      throw std::runtime_error("context parallelism on the CUDA engine needs --seq-length / (2 x --context-parallel-size) to be a multiple of 4 (this run: " +
                               std::to_string(D.S) + " / " + std::to_string(2 * D.cp) + "): change the sequence length, or use --device cpu");
    }
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&cp_stream_, cudaStreamNonBlocking));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&cp_ready_ev_, cudaEventDisableTiming));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&cp_done_ev_, cudaEventDisableTiming));
  }
  cuda::SdpaShape attention{mbs, S_local_, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_, doc_mask_};
  if (D.cp > 1 && D.cp_a2a) attention = {mbs, D.S, D.nh_local / D.cp, D.ng_local / D.cp, D.d, D.softmax_scale, dt_, doc_mask_};  // (the all-to-all's)
  attention.sink = D.sink != ModelDims::Sink::kNone;  // (--softmax-type: every layer's graphs carry the sinks)
  if (D.mla) attention.Dv = D.v_dim;  // (multi-latent attention's values)
  std::string why = cuda::CudnnSdpa::instance().check(attention);
  if (why.empty() && D.attention_dropout > 0) {  // (training's graphs; evaluation's are the ones above)
    attention.dropout = D.attention_dropout;
    why = cuda::CudnnSdpa::instance().check(attention);
  }
  for (const int64_t window : D.windows) {  // (--window-size: each window's graphs, evaluation's and training's)
    if (!why.empty() || window < 0 || window >= attention.S - 1) continue;
    attention.window = window;
    attention.dropout = 0;
    why = cuda::CudnnSdpa::instance().check(attention);
    if (why.empty() && D.attention_dropout > 0) {
      attention.dropout = D.attention_dropout;
      why = cuda::CudnnSdpa::instance().check(attention);
    }
  }
  if (why.empty() && D.cp > 1 && !D.cp_a2a) why = cuda::ring_check({mbs, S_local_ / 2, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_, doc_mask_});
  if (!why.empty()) throw std::runtime_error(why);
}

// The split forward and backward (MEGATRAIN_TP_SPLIT_FORWARD=0 turns both off): TP without K/V
// replication, no MoE layer (it routes the whole microbatch at once), an even micro batch (under SP a multiple of 2 TP, so that every rank's piece of a half is
// whole sequences, and no recomputed layer: the recompute runs the plain forward, in the natural row order),
// cuDNN attention for half of it and, with the bias-gradient epilogue, that epilogue for half of the rows.
// Each half's rows (and under SP each piece's) start 256-byte aligned in every [rows, width] buffer
// (cuBLASLt's plans assume it).
void CudaGPT::choose_split_layers(int64_t mbs, int64_t max_in_flight) {
  const ModelDims& D = D_;
  Scratch& s = *s_;
  const int64_t h = D.h, Wq = W_.Wq, F = W_.F, F1 = W_.F1, T = mbs * S_local_;
  const int64_t half_rows = mbs / 2 * D.S;
  bool aligned = true;
  for (int64_t width : {h, Wq, W_.Hd, W_.KVd, F, F1}) aligned = aligned && (half_rows * width * 2) % 256 == 0;
  aligned = aligned && (piece(half_rows) * h * 2) % 256 == 0;
  const bool any_recompute = std::find(recompute_layer_.begin(), recompute_layer_.end(), true) != recompute_layer_.end();
  const bool sp_ok = !sp_ || (mbs % (2 * tp_size_) == 0 && !any_recompute);
  // (not with the MLP blocks recomputed: the backward would re-run the block over whole rows where the forward split them)
  const char* split_env = std::getenv("MEGATRAIN_TP_SPLIT_FORWARD");
  if (kv_group_ && D.qk_norm) {
    throw std::runtime_error("--qk-layernorm with K/V replicated over TP (fewer query groups than TP) is not implemented on the CUDA engine");
  }
  // (Not with FP8: each half would cast its own rows, and under tensorwise scaling reduce their amaxes over TP beside the
  // other half's reductions on the TP stream.)
  // (the halves' attention graphs: with the sinks, and each window's)
  auto split_attention_ok = [&] {
    cuda::SdpaShape half{mbs / 2, D.S, D.nh_local, D.ng_local, D.d, D.softmax_scale, dt_};
    half.sink = D.sink != ModelDims::Sink::kNone;
    if (!cuda::CudnnSdpa::instance().check(half).empty()) return false;
    for (const int64_t window : D.windows) {
      if (window < 0 || window >= D.S - 1) continue;
      half.window = window;
      if (!cuda::CudnnSdpa::instance().check(half).empty()) return false;
    }
    return true;
  };
  split_forward_ = tp_ && max_in_flight == 1 && pre_ && post_ && sp_ok && !mlp_recompute_ && !needs_whole_microbatches() && !D.fp8 &&
                   std::none_of(layers_.begin(), layers_.end(), [](const LayerW& lw) { return lw.moe; }) &&
                   mbs % 2 == 0 && aligned &&
                   !(split_env && std::string(split_env) == "0") &&
                   split_attention_ok();
  if (split_forward_ && bgrad_epilogue_) {
    // (Under SP the row-parallel biases' gradients come from this rank's rows, not from the epilogue.)
    split_forward_ = bias_grad_fusable(Wq, h, half_rows) && bias_grad_fusable(F1, h, half_rows) &&
                     (sp_ || (bias_grad_fusable(h, F, half_rows) && bias_grad_fusable(h, W_.Hd, half_rows)));
  }
  if (tp_) agree_over_tp(split_forward_, "MEGATRAIN_TP_SPLIT_FORWARD");
  all_to_all_ = split_forward_ && s.parts != nullptr;
  if (split_forward_) {
    int least = 0, greatest = 0;  // the reductions go first when SMs free up
    MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MT_CUDA_CHECK(cudaStreamCreateWithPriority(&tp_stream_, cudaStreamNonBlocking, greatest));
    for (int i = 0; i < 2; ++i) {
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_ev_[i], cudaEventDisableTiming));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_ev_[i], cudaEventDisableTiming));
    }
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&tp_done_ev_, cudaEventDisableTiming));
    // The split backward's norms run on tp_stream_, away from the caching allocator (compute stream only).
    const auto part_bytes = static_cast<size_t>(cuda::norm_backward_partials(h)) * 4;
    s.norm_part = static_cast<float*>(alloc(part_bytes));
    act_bytes_ += part_bytes;
    if (sp_) s.half_pos = static_cast<int32_t*>(alloc(static_cast<size_t>(T) * 4));
  }
}

CudaGPT::WgradOverwrite CudaGPT::wgrad_overwrite_mode() {
  static const WgradOverwrite mode = [] {
    const char* env = std::getenv("MEGATRAIN_WGRAD_OVERWRITE");
    const std::string v = env ? env : "";
    if (v.empty()) return WgradOverwrite::kAuto;
    if (v == "0") return WgradOverwrite::kOff;
    if (v == "1") return WgradOverwrite::kOn;
    if (v == "check") return WgradOverwrite::kCheck;
    throw std::invalid_argument("MEGATRAIN_WGRAD_OVERWRITE=" + v + " is not 0, 1 or check: unset it (on for one rank) or set one of those");
  }();
  return mode;
}

void CudaGPT::choose_overwritten_gradients(int64_t world_size) {
  const WgradOverwrite mode = wgrad_overwrite_mode();
  if (mode == WgradOverwrite::kOff || (mode == WgradOverwrite::kAuto && world_size > 1)) return;
  if (split_forward_) return;  // (the split layers' halves add to one gradient)
  const int64_t h = D_.h;
  for (const LayerW& lw : layers_) {
    // (an MoE layer has no fc1 / fc2 of its own: -1)
    for (const auto& [off, count] : {std::pair{lw.qkv_w, W_.Wq * h}, std::pair{lw.proj_w, h * W_.Od}, std::pair{lw.fc1_w, W_.F1 * h},
                                     std::pair{lw.fc2_w, h * W_.F}}) {
      if (off >= 0) overwrite_ranges_.emplace_back(off, count);
    }
    if (!lw.moe) continue;
    // An MoE layer's experts (a routed expert that gets no rows in the whole iteration is zeroed at its last backward:
    // zero_unwritten_experts) and its shared expert.
    const int64_t f1 = D_.swiglu ? 2 * F_moe_ : F_moe_, shared_f1 = D_.swiglu ? 2 * F_shared_ : F_shared_;
    for (size_t e = 0; e < lw.expert_fc1.size(); ++e) {
      overwrite_ranges_.emplace_back(lw.expert_fc1[e], f1 * h);
      overwrite_ranges_.emplace_back(lw.expert_fc2[e], h * F_moe_);
    }
    if (lw.shared_fc1_w >= 0) {
      overwrite_ranges_.emplace_back(lw.shared_fc1_w, shared_f1 * h);
      overwrite_ranges_.emplace_back(lw.shared_fc2_w, h * F_shared_);
    }
  }
  if (post_ && out_w_ >= 0 && !D_.tied) overwrite_ranges_.emplace_back(out_w_, D_.V_local * h);
  std::sort(overwrite_ranges_.begin(), overwrite_ranges_.end());
  for (size_t i = 1; i < overwrite_ranges_.size(); ++i) {
    if (overwrite_ranges_[i - 1].first + overwrite_ranges_[i - 1].second > overwrite_ranges_[i].first) {
      throw std::logic_error("CUDA model: overlapping weight gradient ranges");
    }
  }
  overwrite_written_.assign(overwrite_ranges_.size(), char{1});  // (begin_gradients clears them: until then, accumulate)
}

char* CudaGPT::overwrite_flag(int64_t off, int64_t* count) {
  const auto it = std::lower_bound(overwrite_ranges_.begin(), overwrite_ranges_.end(), std::pair{off, int64_t{0}});
  if (it == overwrite_ranges_.end() || it->first != off) return nullptr;
  if (count) *count = it->second;
  return &overwrite_written_[static_cast<size_t>(it - overwrite_ranges_.begin())];
}

void CudaGPT::zero_unwritten_experts(const LayerW& lw) {
  for (const std::vector<int64_t>* weights : {&lw.expert_fc1, &lw.expert_fc2}) {
    for (int64_t off : *weights) {
      int64_t count = 0;
      char* written = overwrite_flag(off, &count);
      if (written == nullptr || *written) continue;
      MT_PROF("bwd.moe.zero_grads", MT_CUDA_CHECK(cudaMemsetAsync(g(off), 0, static_cast<size_t>(count) * 4, stream_)));
      *written = 1;
    }
  }
}

void CudaGPT::check_gradients_written() const {
  for (size_t i = 0; i < overwrite_ranges_.size(); ++i) {
    if (!overwrite_written_[i]) {
      throw std::logic_error("CUDA model: the weight gradient at offset " + std::to_string(overwrite_ranges_[i].first) +
                             " was not written this iteration (the weight gradients written by their first GEMM): set MEGATRAIN_WGRAD_OVERWRITE=0, and report it");
    }
  }
}

float CudaGPT::wgrad_beta(int64_t w_off) {
  char* written = overwrite_flag(w_off);
  if (written == nullptr || *written) return 1.0f;
  *written = 1;
  return 0.0f;
}

}  // namespace mt
