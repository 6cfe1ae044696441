// gpt_cuda_moe_fp8.cpp: the MoE layers' expert GEMMs in FP8 on the CUDA engine, as the CPU engine's experts_forward
// emulates them (model/cpu/moe_unit.cpp through linear_gemms): each routed expert's fc1 and fc2, and the shared
// expert's, quantised with scales of their own (Transformer Engine's grouped linear in Megatron's TEGroupedMLP: a
// quantiser per GEMM), tensorwise (from the amaxes of the expert's rows, its weight and its output gradient) or
// blockwise (1 x 128 blocks of the rows, 128 x 128 of the weight, 128 rows of a feature for the weight gradient), or
// delayed (each expert's two sites with scales and amax histories of their own, model/fp8_scaling.h: the casts take the
// scale as it stands and add their amax to the site's accumulator in the same pass; the shared expert's, the layer's fc1
// and fc2 sites).
//
// Hopper's FP8 GEMMs take every dimension a multiple of 16, and the weight gradient's dimension is the expert's rows.
// So, as Megatron pads each expert's rows for FP8 (Fp8Padding), every expert's rows start at a multiple of 16
// (moe_row_align_: the permutation leaves the gaps) and its GEMMs run over its rows rounded up, the gap's rows zero in
// the expert's input and output gradient (zero_expert_padding), so that they add nothing to an amax, an output row that
// is read or a weight gradient. The weights are cast once per iteration (W and W^T, as the dense layers': the
// forward's first training microbatch) and kept; x^T is kept in the layer's record for the weight gradient.
#include "model/cuda/gpt_cuda_state.h"

#include <stdexcept>

#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/gemm_lt.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

namespace {
int64_t pad4(int64_t n) { return (n + 3) / 4 * 4; }
int64_t row_blocks(int64_t width) { return (width + cuda::kFp8BlockSize - 1) / cuda::kFp8BlockSize; }
}  // namespace

void CudaGPT::allocate_expert_fp8_weights() {
  const int64_t E = experts_, h = D_.h;
  f8_expert_w_.assign(static_cast<size_t>(L_ * (E + 1) * 2), ExpertFp8Weight{});
  for (int64_t l = 0; l < L_; ++l) {
    const LayerW& lw = layers_[static_cast<size_t>(l)];
    if (!lw.moe || !fp8_layer(l)) continue;
    for (int64_t e = 0; e <= E; ++e) {
      if (e == E && lw.shared_fc1_w < 0) break;
      const int64_t F = e == E ? F_shared_ : F_moe_, F1 = D_.swiglu ? 2 * F : F;
      const int64_t outs[2] = {F1, h}, ins[2] = {h, F};
      for (int site = 0; site < 2; ++site) {
        ExpertFp8Weight& wt = f8_expert_w_[static_cast<size_t>((l * (E + 1) + e) * 2 + site)];
        const auto bytes = static_cast<size_t>(outs[site] * ins[site]);
        wt.wq = static_cast<uint8_t*>(alloc(bytes));
        wt.wqt = static_cast<uint8_t*>(alloc(bytes));
        if (D_.fp8_blockwise) {
          wt.scale = block_scales(cuda::fp8_blk128_scales(outs[site], ins[site]));
          wt.tscale = block_scales(cuda::fp8_blk128_scales(ins[site], outs[site]));
        } else {
          wt.inv = static_cast<float*>(alloc(64 * sizeof(float)));
        }
      }
    }
  }
}

// (The block scales' buffers are not zeroed as block_scales()'s are: h, the experts' widths and every expert's rows are
// multiples of 16 here, so their layouts have no padding entries to hold.)
void CudaGPT::expert_fp8_rows(Record& r, int64_t rows, bool forward) {
  Scratch& s = *s_;
  const auto idle = [this] { host_wait("the FP8 experts' buffers"); };
  const int64_t width = f8_moe_width_, blocks = rows / cuda::kFp8BlockSize + D_.experts_local + 1;
  const auto n = static_cast<size_t>(rows);
  if (forward && f8_keep_xt_) {
    const int64_t widths[2] = {D_.h, F_moe_};
    for (int site = 0; site < 2; ++site) {
      r.ep_f8_xt[site].need<uint8_t>(n * static_cast<size_t>(widths[site]), idle);
      if (D_.fp8_blockwise) r.ep_f8_xt_scale[site].need<float>(static_cast<size_t>(pad4(widths[site]) * blocks) * 4, idle);
    }
  }
  s.ep_f8_row.need<uint8_t>(n * static_cast<size_t>(width), idle);
  if (!forward) s.ep_f8_dyt.need<uint8_t>(n * static_cast<size_t>(width), idle);
  if (D_.fp8_blockwise) {
    s.ep_f8_row_scale.need<float>(n * static_cast<size_t>(row_blocks(width)) * 4, idle);
    if (!forward) s.ep_f8_dyt_scale.need<float>(static_cast<size_t>(pad4(width) * blocks) * 4, idle);
  }
}

CudaGPT::ExpertFp8 CudaGPT::expert_fp8(int64_t l, Record& r, int64_t e, int64_t off, int64_t blocks) {
  const int64_t E = experts_;
  const bool shared = e == E;
  Scratch& s = *s_;
  ExpertFp8 f;
  const int64_t widths[2] = {D_.h, shared ? F_shared_ : F_moe_};
  // (Under EP the routed experts' rows are those that arrived, their buffers expert_fp8_rows's.)
  const bool arrived = D_.ep > 1 && !shared;
  for (int site = 0; site < 2; ++site) {
    f.w[site] = &f8_expert_w_[static_cast<size_t>((l * (E + 1) + e) * 2 + site)];
    if (f.w[site]->wq == nullptr) throw std::logic_error("CUDA model: an FP8 expert without its FP8 weights");
    if (f8_keep_xt_) {  // (evaluation keeps no x^T: nothing reads it)
      uint8_t* xt = arrived ? r.ep_f8_xt[site].get<uint8_t>() : r.ex_f8_xt[site];
      f.xt[site] = shared ? r.sh_f8_xt[site] : xt + off * widths[site];
      if (D_.fp8_blockwise) {
        float* xt_scale = arrived ? r.ep_f8_xt_scale[site].get<float>() : r.ex_f8_xt_scale[site];
        f.xt_scale[site] = shared ? r.sh_f8_xt_scale[site] : xt_scale + blocks * pad4(widths[site]);
      }
    }
    f.xinv[site] = r.ex_f8_xinv + (e * 2 + site) * 64;
  }
  // (Under EP dy^T's buffers exist from the first backward on: a forward takes null for them, never read there.)
  const auto at = [](auto* base, int64_t offset) { return base ? base + offset : nullptr; };
  f.row = at(arrived ? s.ep_f8_row.get<uint8_t>() : s.ex_f8_row, off * f8_moe_width_);
  f.dyt = at(arrived ? s.ep_f8_dyt.get<uint8_t>() : s.ex_f8_dyt, off * f8_moe_width_);
  if (D_.fp8_blockwise) {
    f.row_scale = at(arrived ? s.ep_f8_row_scale.get<float>() : s.ex_f8_row_scale, off * row_blocks(f8_moe_width_));
    f.dyt_scale = at(arrived ? s.ep_f8_dyt_scale.get<float>() : s.ex_f8_dyt_scale, blocks * pad4(f8_moe_width_));
  }
  f.scalars = s.ex_f8_scalars + e * 3 * 64;
  if (f8_scale_) {
    for (int site = 0; site < 2; ++site) f.slot[site] = fp8_scaling_slot(l, shared ? (site ? kLinearFc2 : kLinearFc1) : fp8_expert_site(e, site == 1));
    const LayerW& lw = layers_[static_cast<size_t>(l)];
    const bool bias = !shared && !lw.expert_fc1_b.empty() && lw.expert_fc1_b[static_cast<size_t>(e)] >= 0;
    f.fuse_swiglu = D_.swiglu && D_.glu.plain_swiglu() && dt_ == cuda::F16::kBF16 && !bias && fp8_fused_swiglu_;
  }
  return f;
}

void CudaGPT::zero_expert_padding(bf16* buf, int64_t width, const std::vector<int32_t>& per_expert, cudaStream_t st) {
  int64_t off = 0;
  for (int32_t n : per_expert) {
    const int64_t padded = align_rows(n);
    if (n > 0 && padded > n) {
      MT_PROF_ON(st, "moe.fp8_padding", MT_CUDA_CHECK(cudaMemsetAsync(buf + (off + n) * width, 0, static_cast<size_t>((padded - n) * width) * 2, st)));
    }
    off += padded;
  }
}

void CudaGPT::cast_expert_fp8_weight(const ExpertFp8Weight& wt, int64_t slot, int64_t w_off, int64_t out, int64_t in, cudaStream_t st) {
  const auto e4m3 = cuda::Fp8Type::kE4M3;
  if (D_.fp8_blockwise) {
    MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_quantize_128x128(w(w_off), out, in, e4m3, wt.wq, wt.scale, wt.wqt, wt.tscale, st));
    return;
  }
  if (f8_scale_) {  // delayed
    MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_cast_scaled(w(w_off), out, in, fp8_weight_scale(slot), fp8_weight_accumulator(slot), e4m3, wt.wq, wt.wqt,
                                                             wt.inv, st));
    return;
  }
  MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_amax(w(w_off), out * in, wt.inv + 1, st));
  MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_cast(w(w_off), out, in, wt.inv + 1, e4m3, wt.wq, wt.wqt, wt.inv, st));
}

void CudaGPT::cast_idle_expert_fp8_weights(int64_t l, const std::vector<int32_t>& per_expert) {
  if (!f8_forward_casts_weights_) return;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  const int64_t E = experts_, h = D_.h, F1 = D_.swiglu ? 2 * F_moe_ : F_moe_;
  for (size_t e = 0; e < per_expert.size(); ++e) {
    if (per_expert[e] > 0) continue;
    const auto j = static_cast<int64_t>(e);
    const auto at = static_cast<size_t>((l * (E + 1) + j) * 2);
    const int64_t fc1_slot = f8_scale_ ? fp8_scaling_slot(l, fp8_expert_site(j, false)) : -1;
    const int64_t fc2_slot = f8_scale_ ? fp8_scaling_slot(l, fp8_expert_site(j, true)) : -1;
    cast_expert_fp8_weight(f8_expert_w_[at], fc1_slot, lw.expert_fc1[e], F1, h, stream_);
    cast_expert_fp8_weight(f8_expert_w_[at + 1], fc2_slot, lw.expert_fc2[e], h, F_moe_, stream_);
  }
}

cuda::Fp8CastTarget CudaGPT::expert_input_target(const ExpertFp8& f, int site) const {
  return {.scale = fp8_slot_scales(false) + f.slot[site],  // (the microbatch's; a recompute's the first forward's)
          .amax_accumulator = fp8_input_accumulator(f.slot[site]),
          .type = cuda::Fp8Type::kE4M3,
          .out = f.row,
          .out_t = f.xt[site],  // (not in evaluation: no backward reads it)
          .scale_inv = f.xinv[site]};
}

cuda::Fp8CastTarget CudaGPT::expert_grad_target(const ExpertFp8& f, int site) const {
  return {.scale = fp8_slot_scales(true) + f.slot[site],
          .amax_accumulator = fp8_grad_accumulator(f.slot[site]),
          .type = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3,
          .out = f.row,
          .out_t = f.dyt,
          .scale_inv = f.scalars + 128};
}

bool CudaGPT::expert_swiglu_fp8(const ExpertFp8& f, const char* name, int64_t n, int64_t F, const bf16* fc1_out, cudaStream_t st) {
  if (!f.fuse_swiglu) return false;
  bool cast = false;
  MT_PROF_ON(st, name, cast = cuda::fp8_swiglu_forward_cast(fc1_out, n, F, expert_input_target(f, 1), nullptr, st));
  return cast;
}

bool CudaGPT::expert_swiglu_backward_fp8(const ExpertFp8& f, const char* name, int64_t n, int64_t F, const bf16* dact, const bf16* fc1_out,
                                         cudaStream_t st) {
  if (!f.fuse_swiglu) return false;
  bool cast = false;
  MT_PROF_ON(st, name, cast = cuda::fp8_swiglu_backward_cast(dact, fc1_out, n, F, expert_grad_target(f, 0), st));
  return cast;
}

void CudaGPT::expert_linear_fp8(const ExpertFp8& f, int site, const char* name, int64_t n, int64_t in, int64_t out, const bf16* x, int64_t w_off,
                                const bf16* bias, float beta, bf16* y, cudaStream_t st, bool x_cast) {
  using Mode = cuda::GemmLt::ScaleMode;
  auto& lt = cuda::GemmLt::instance();
  const auto e4m3 = cuda::Fp8Type::kE4M3;
  const ExpertFp8Weight& wt = *f.w[site];
  if (f8_forward_casts_weights_) cast_expert_fp8_weight(wt, f.slot[site], w_off, out, in, st);  // (else this iteration's cast, kept)
  if (D_.fp8_blockwise) {
    MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_quantize_1x128(x, n, in, e4m3, f.row, f.row_scale, f.xt[site], f.xt_scale[site], st));
    MT_PROF_ON(st, name, lt.gemm_fp8(n, out, in, 1.0f, f.row, CUDA_R_8F_E4M3, f.row_scale, wt.wq, CUDA_R_8F_E4M3, wt.scale, beta, y, out, CUDA_R_16BF,
                                     bias, false, st, Mode::kVec128, Mode::kBlock128, true));
    return;
  }
  if (x_cast && !f8_scale_) throw std::logic_error("CUDA model: an expert's FP8 input cast by its producer without delayed scaling");
  if (f8_scale_) {  // delayed: the scale as it stands, the amax to the accumulator
    if (!x_cast) {
      const cuda::Fp8CastTarget t = expert_input_target(f, site);
      MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_cast_scaled(x, n, in, t.scale, t.amax_accumulator, t.type, t.out, t.out_t, t.scale_inv, st));
    }
  } else {
    float* amax_x = f.scalars;
    MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_amax(x, n * in, amax_x, st));
    MT_PROF_ON(st, "fwd.moe.fp8_cast", cuda::fp8_cast(x, n, in, amax_x, e4m3, f.row, f.xt[site], f.xinv[site], st));
  }
  MT_PROF_ON(st, name, lt.gemm_fp8(n, out, in, 1.0f, f.row, CUDA_R_8F_E4M3, f.xinv[site], wt.wq, CUDA_R_8F_E4M3, wt.inv, beta, y, out, CUDA_R_16BF, bias,
                                   true, st, Mode::kTensor, Mode::kTensor, true));
}

void CudaGPT::expert_linear_fp8_backward(const ExpertFp8& f, int site, const char* dgrad_name, const char* wgrad_name, int64_t n, int64_t in,
                                         int64_t out, const bf16* dy, int64_t w_off, float dx_beta, bf16* dx, cudaStream_t st, bool dy_cast) {
  using Mode = cuda::GemmLt::ScaleMode;
  auto& lt = cuda::GemmLt::instance();
  if (f.xt[site] == nullptr) throw std::logic_error("CUDA model: an FP8 expert's backward without its forward's x^T");
  const ExpertFp8Weight& wt = *f.w[site];
  const auto grad = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3;
  const float beta = wgrad_beta(w_off);
  if (D_.fp8_blockwise) {
    MT_PROF_ON(st, "bwd.moe.fp8_cast", cuda::fp8_quantize_1x128(dy, n, out, grad, f.row, f.row_scale, f.dyt, f.dyt_scale, st));
    MT_PROF_ON(st, dgrad_name, lt.gemm_fp8(n, in, out, 1.0f, f.row, fp8_data_type(grad), f.row_scale, wt.wqt, CUDA_R_8F_E4M3, wt.tscale, dx_beta, dx, in,
                                           CUDA_R_16BF, nullptr, false, st, Mode::kVec128, Mode::kBlock128, true));
    MT_PROF_ON(st, wgrad_name, lt.gemm_fp8(out, in, n, 1.0f, f.dyt, fp8_data_type(grad), f.dyt_scale, f.xt[site], CUDA_R_8F_E4M3, f.xt_scale[site], beta,
                                           g(w_off), in, CUDA_R_32F, nullptr, false, st, Mode::kVec128, Mode::kVec128, true));
    return;
  }
  float *amax_dy = f.scalars + 64, *dy_inv = f.scalars + 128;
  if (dy_cast && !f8_scale_) throw std::logic_error("CUDA model: an expert's FP8 output gradient cast by its producer without delayed scaling");
  if (f8_scale_) {  // delayed: the backward's scale, the amax to the accumulator
    if (!dy_cast) {
      const cuda::Fp8CastTarget t = expert_grad_target(f, site);
      MT_PROF_ON(st, "bwd.moe.fp8_cast", cuda::fp8_cast_scaled(dy, n, out, t.scale, t.amax_accumulator, t.type, t.out, t.out_t, t.scale_inv, st));
    }
  } else {
    MT_PROF_ON(st, "bwd.moe.fp8_cast", cuda::fp8_amax(dy, n * out, amax_dy, st));
    MT_PROF_ON(st, "bwd.moe.fp8_cast", cuda::fp8_cast(dy, n, out, amax_dy, grad, f.row, f.dyt, dy_inv, st));
  }
  MT_PROF_ON(st, dgrad_name, lt.gemm_fp8(n, in, out, 1.0f, f.row, fp8_data_type(grad), dy_inv, wt.wqt, CUDA_R_8F_E4M3, wt.inv, dx_beta, dx, in, CUDA_R_16BF,
                                         nullptr, false, st, Mode::kTensor, Mode::kTensor, true));
  MT_PROF_ON(st, wgrad_name, lt.gemm_fp8(out, in, n, 1.0f, f.dyt, fp8_data_type(grad), dy_inv, f.xt[site], CUDA_R_8F_E4M3, f.xinv[site], beta, g(w_off), in,
                                         CUDA_R_32F, nullptr, false, st, Mode::kTensor, Mode::kTensor, true));
}

}  // namespace mt
