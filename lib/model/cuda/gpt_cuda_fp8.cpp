// gpt_cuda_fp8.cpp: a layer's linear GEMMs in its precision. bf16: cuBLASLt as before. FP8 (Transformer
// Engine's tensorwise recipe, as the CPU engine emulates it in model/cpu/linear_gemms): the input and the weight
// cast to E4M3 with their own amax, the output gradient to E5M2 (hybrid) or E4M3, every GEMM "TN" with device
// scales; the forward accumulates fast (split-accumulator off), the gradient GEMMs precisely, as TE does.
//   forward  y [T, out]  = x [T, in] . W [out, in]^T          (x, W row-major as they are)
//   dgrad    dx [T, in]  = dy [T, out] . (W^T [in, out])^T     (W^T cast with W, once per iteration: see f8_wq_)
//   wgrad    dW [out, in] += dy^T [out, T] . (x^T [in, T])^T   (dy^T from the dgrad's cast, x^T written by the forward's
//                                                               cast beside x, kept in the layer's record)
// Delayed scaling (model/fp8_scaling.h): the casts take their scales from the state and add their amaxes to its
// accumulators in the same pass (no amax pass); a deferred weight gradient's dy^T casts again with the first cast's
// scale.
#include <stdexcept>
#include <string>

#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/gemm_lt.h"
#include "model/cuda/gpt_cuda_state.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

void CudaGPT::init_fp8_scaling(StreamCollectives* dp) {
  for (int64_t l = 0; l < L_; ++l) {
    if (!fp8_layer(l)) throw std::logic_error("CUDA model: FP8 delayed scaling with a layer in 16 bits (refused by the validation)");
  }
  if (moe_layers_ > 0 && D_.ep > 1) throw std::logic_error("CUDA model: FP8 delayed scaling with expert parallelism (refused by the validation)");
  f8_recipe_ = fp8_delayed_recipe(D_);
  const Fp8ScalingState layout = fp8_scaling_layout();
  f8_slots_ = layout.slots();
  f8_first_ = layout.first;
  amax_group_ = D_.fp8_amax_over_dp ? dp : nullptr;  // (--tp-only-amax-red: TP only; CP is refused on the CUDA engine)
  const auto n = static_cast<size_t>(f8_slots_), len = static_cast<size_t>(f8_recipe_.history_len);
  f8_scale_ = static_cast<float*>(alloc(3 * n * 4));
  f8_history_ = static_cast<float*>(alloc(3 * len * n * 4));
  f8_wcast_ = static_cast<float*>(alloc(n * 4));
  for (Slot& slot : slots_) {
    slot.f8_x_scale = static_cast<float*>(alloc(n * 4));
    slot.f8_dy_scale = static_cast<float*>(alloc(n * 4));
  }
  set_fp8_scaling_state(layout);
}

// Every layer of the chunk is an FP8 layer under delayed scaling; an MoE layer has its routed experts' sites too (this
// rank's experts: all of them, expert parallelism being refused with delayed scaling).
Fp8ScalingState CudaGPT::fp8_scaling_layout() const {
  std::vector<int64_t> layers, experts;
  for (int64_t l = 0; l < L_; ++l) {
    layers.push_back(first_layer_ + l);
    experts.push_back(layers_[static_cast<size_t>(l)].moe ? experts_ : 0);
  }
  return Fp8ScalingState(f8_recipe_, layers, experts);
}

Fp8ScalingState CudaGPT::fp8_scaling_state() const {
  Fp8ScalingState st = fp8_scaling_layout();
  MT_CUDA_CHECK(cudaMemcpyAsync(st.scale.data(), f8_scale_, st.scale.size() * 4, cudaMemcpyDeviceToHost, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(st.history.data(), f8_history_, st.history.size() * 4, cudaMemcpyDeviceToHost, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(st.weight_cast_scale.data(), f8_wcast_, st.weight_cast_scale.size() * 4, cudaMemcpyDeviceToHost, stream_));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return st;
}

std::vector<float> CudaGPT::fp8_last_inverse_scales() const {
  std::vector<float> out(static_cast<size_t>(8 * L_), 0.0f);
  if (!f8_winv_) return out;
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<float> all(static_cast<size_t>(4 * L_ * 64));
  MT_CUDA_CHECK(cudaMemcpy(all.data(), f8_winv_, all.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < static_cast<size_t>(4 * L_); ++k) out[k] = all[64 * k];
  for (int64_t l = 0; l < L_; ++l) {
    const Record* r = static_cast<size_t>(l) < records_.size() ? records_[static_cast<size_t>(l)].get() : nullptr;
    if (r == nullptr || r->f8_xinv == nullptr) continue;
    std::vector<float> x(4 * 64);
    MT_CUDA_CHECK(cudaMemcpy(x.data(), r->f8_xinv, x.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t site = 0; site < 4; ++site) out[static_cast<size_t>(4 * L_ + 4 * l) + site] = x[64 * site];
  }
  return out;
}

void CudaGPT::set_fp8_scaling_state(const Fp8ScalingState& st) {
  if (st.slots() != f8_slots_ || st.recipe.history_len != f8_recipe_.history_len) throw std::logic_error("CUDA model: FP8 scaling state of another shape");
  MT_CUDA_CHECK(cudaMemcpyAsync(f8_scale_, st.scale.data(), st.scale.size() * 4, cudaMemcpyHostToDevice, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(f8_history_, st.history.data(), st.history.size() * 4, cudaMemcpyHostToDevice, stream_));
  MT_CUDA_CHECK(cudaMemcpyAsync(f8_wcast_, st.weight_cast_scale.data(), st.weight_cast_scale.size() * 4, cudaMemcpyHostToDevice, stream_));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // (the host copies are the caller's)
}

void CudaGPT::fp8_update(int first_kind, int last_kind) {
  const int64_t n = f8_slots_, count = (last_kind - first_kind + 1) * n;
  float* acc = f8_history_ + first_kind * n;  // the kinds' accumulators, contiguous
  if (tp_) MT_PROF("fp8.amax_reduce", tp_->all_reduce_on(acc, count, WireType::kF32, ReduceOp::kMax, stream_));
  if (amax_group_) MT_PROF("fp8.amax_reduce", amax_group_->all_reduce_on(acc, count, WireType::kF32, ReduceOp::kMax, stream_));
  for (int k = first_kind; k <= last_kind; ++k) {
    MT_PROF("fp8.scale_update", cuda::fp8_delayed_update(f8_scale_ + k * n, f8_history_ + k * n, n, 3 * n, f8_recipe_.history_len,
                                                         f8_recipe_.max_algo, f8_recipe_.scaled_max(k != kFp8GradOutput), stream_));
  }
}

// Tensorwise scaling under TP: an amax is the whole tensor's, as on one GPU (and as the CPU engine's emulation, docs/fp8.md).
// A column-parallel layer's input (QKV's, fc1's: the norm's output, under SP gathered) and a row-parallel layer's output
// gradient (the residual stream's, under SP gathered) are whole on every TP rank; the row-parallel inputs (projection,
// fc2), the column-parallel output gradients (QKV, fc1) and every weight are shards, whose amax is reduced (max) over TP.
bool CudaGPT::fp8_tp_sharded(int site, bool output_gradient) const {
  if (!tp_) return false;
  const bool row_parallel = site == kLinearProj || site == kLinearFc2;
  return output_gradient ? !row_parallel : row_parallel;
}

void CudaGPT::fp8_amax_over_tp(float* amax) {
  MT_PROF("fp8.amax_reduce", tp_->all_reduce_on(amax, 1, WireType::kF32, ReduceOp::kMax, stream_));
}

float* CudaGPT::fp8_slot_scales(bool grad) const {
  const Slot& slot = slots_[static_cast<size_t>(active_)];
  return grad ? slot.f8_dy_scale : slot.f8_x_scale;
}

const float* CudaGPT::fp8_weight_scale(int64_t slot) const {
  return f8_training_ ? f8_wcast_ + slot : f8_scale_ + kFp8Weight * f8_slots_ + slot;
}
float* CudaGPT::fp8_input_accumulator(int64_t slot) const { return f8_scale_ && f8_record_ ? f8_history_ + kFp8Input * f8_slots_ + slot : nullptr; }
float* CudaGPT::fp8_weight_accumulator(int64_t slot) const { return f8_cast_weights_ ? f8_history_ + kFp8Weight * f8_slots_ + slot : nullptr; }
float* CudaGPT::fp8_grad_accumulator(int64_t slot) const { return f8_history_ + kFp8GradOutput * f8_slots_ + slot; }

cuda::Fp8CastTarget CudaGPT::fp8_input_target(int64_t l, Record& r, int site) const {
  const int64_t slot = f8_scale_ ? fp8_scaling_slot(l, site) : 0;
  return {.scale = f8_scale_ ? fp8_slot_scales(false) + slot : nullptr,  // (tensorwise: from the amax)
          .amax_accumulator = fp8_input_accumulator(slot),
          .type = cuda::Fp8Type::kE4M3,
          .out = s_->f8_row,
          .out_t = D_.fp8_wgrad && f8_keep_xt_ ? r.f8_xt[site] : nullptr,  // (not in evaluation: no backward reads it)
          .scale_inv = r.f8_xinv + 64 * site};  // (x^T, kept for the weight gradient, carries it too)
}

cuda::Fp8CastTarget CudaGPT::fp8_grad_target(int64_t l, int site) const {
  const int64_t slot = fp8_scaling_slot(l, site);
  return {.scale = fp8_slot_scales(true) + slot,
          .amax_accumulator = fp8_grad_accumulator(slot),
          .type = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3,
          .out = s_->f8_row,
          .out_t = D_.fp8_wgrad ? s_->f8_dyt : nullptr,
          .scale_inv = s_->f8_scalar(3)};
}

// SwiGLU's FP8 casts fused: delayed scaling (the scale known before the tensor exists), bf16, a dense layer (an MoE
// layer's experts: ExpertFp8::fuse_swiglu).
bool CudaGPT::fp8_fuses_swiglu(int64_t l) const {
  return D_.swiglu && D_.glu.plain_swiglu() && D_.fp8_delayed && f8_scale_ != nullptr && fp8_layer(l) && dt_ == cuda::F16::kBF16 && !layers_[static_cast<size_t>(l)].moe &&
         fp8_fused_swiglu_;
}

// ... and then nothing reads SwiGLU's 16-bit output (an FP8 weight gradient reads fc2's FP8 x^T), so no FP8 layer's
// record keeps it. (Delayed scaling keeps every layer in FP8: --first-last-layers-bf16 is refused with it.)
bool CudaGPT::swiglu_output_unread() const {
  return D_.swiglu && D_.glu.plain_swiglu() && D_.fp8_delayed && D_.fp8_wgrad && dt_ == cuda::F16::kBF16 && fp8_fused_swiglu_;
}

// The same for the routed experts where every one of them fuses (ExpertFp8::fuse_swiglu: no biases).
bool CudaGPT::experts_swiglu_output_unread() const { return swiglu_output_unread() && !D_.bias; }

void CudaGPT::linear_forward(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* x, int64_t w_off,
                             const bf16* bias, bf16* y, bool x_cast) {
  auto& lt = cuda::GemmLt::instance();
  if (!fp8_layer(l)) {
    MT_PROF(name, lt.gemm_ex(false, true, T, out, in, 1.0f, x, in, w(w_off), in, 0.0f, y, out, ab_, ab_, bias, stream_));
    return;
  }
  const auto e4m3 = cuda::Fp8Type::kE4M3;
  const cuda::Fp8CastTarget t = fp8_input_target(l, r, site);
  const auto k = static_cast<size_t>(l * kFp8Sites + site);
  uint8_t *wq = f8_wq_[k], *wqt = f8_wqt_[k];
  float* w_inv = f8_winv_ + 64 * k;
  const bool cast_w = f8_forward_casts_weights_;  // (else this iteration's cast, kept)
  if (D_.fp8_blockwise) {  // x in 1 x 128 blocks along its rows (x^T in blocks of 128 tokens), W in 128 x 128 blocks
    if (x_cast) throw std::logic_error("CUDA model: blockwise FP8 takes no input cast by its producer");
    using Mode = cuda::GemmLt::ScaleMode;
    Scratch& s = *s_;
    MT_PROF("fwd.fp8_cast", cuda::fp8_quantize_1x128(x, T, in, e4m3, s.f8_row, s.f8_row_scale, t.out_t, t.out_t ? r.f8_xt_scale[site] : nullptr, stream_));
    if (cast_w) MT_PROF("fwd.fp8_cast", cuda::fp8_quantize_128x128(w(w_off), out, in, e4m3, wq, f8_wscale_[k], wqt, f8_wtscale_[k], stream_));
    MT_PROF(name, lt.gemm_fp8(T, out, in, 1.0f, s.f8_row, CUDA_R_8F_E4M3, s.f8_row_scale, wq, CUDA_R_8F_E4M3, f8_wscale_[k], 0.0f, y, out,
                              CUDA_R_16BF, bias, false, stream_, Mode::kVec128, Mode::kBlock128));
    return;
  }
  if (x_cast && !f8_scale_) throw std::logic_error("CUDA model: an FP8 input cast by its producer without delayed scaling");
  if (f8_scale_) {
    const int64_t slot = fp8_scaling_slot(l, site);
    if (!x_cast) MT_PROF("fwd.fp8_cast", cuda::fp8_cast_scaled(x, T, in, t.scale, t.amax_accumulator, e4m3, t.out, t.out_t, t.scale_inv, stream_));
    if (cast_w) {
      MT_PROF("fwd.fp8_cast", cuda::fp8_cast_scaled(w(w_off), out, in, fp8_weight_scale(slot), fp8_weight_accumulator(slot), e4m3, wq, wqt, w_inv, stream_));
    }
  } else {
    float* amax_x = r.f8_amax + 2 * site;
    float* amax_w = f8_winv_ + 64 * k + 1;  // (the weight's amax beside its inverse scale)
    MT_PROF("fwd.fp8_cast", cuda::fp8_amax(x, T * in, amax_x, stream_));
    if (fp8_tp_sharded(site, false)) fp8_amax_over_tp(amax_x);
    MT_PROF("fwd.fp8_cast", cuda::fp8_cast(x, T, in, amax_x, e4m3, t.out, t.out_t, t.scale_inv, stream_));
    if (cast_w) {
      MT_PROF("fwd.fp8_cast", cuda::fp8_amax(w(w_off), out * in, amax_w, stream_));
      if (tp_) fp8_amax_over_tp(amax_w);  // (every weight is a shard under TP)
      MT_PROF("fwd.fp8_cast", cuda::fp8_cast(w(w_off), out, in, amax_w, e4m3, wq, wqt, w_inv, stream_));
    }
  }
  MT_PROF(name, lt.gemm_fp8(T, out, in, 1.0f, t.out, CUDA_R_8F_E4M3, t.scale_inv, wq, CUDA_R_8F_E4M3, w_inv, 0.0f, y, out,
                            CUDA_R_16BF, bias, true, stream_));
}

void CudaGPT::linear_dgrad(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* dy, int64_t w_off,
                           bf16* dx, bool dy_cast) {
  auto& lt = cuda::GemmLt::instance();
  if (!fp8_layer(l)) {
    MT_PROF(name, lt.gemm_ex(false, false, T, in, out, 1.0f, dy, out, w(w_off), in, 0.0f, dx, in, ab_, ab_, nullptr, stream_));
    return;
  }
  Scratch& s = *s_;
  const auto grad = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3;
  if (D_.fp8_blockwise) {  // dy in 1 x 128 blocks along its rows, dy^T in blocks of 128 tokens; W^T's 128 x 128 blocks
    if (dy_cast) throw std::logic_error("CUDA model: blockwise FP8 takes no output gradient cast by its producer");
    using Mode = cuda::GemmLt::ScaleMode;
    const auto k = static_cast<size_t>(l * kFp8Sites + site);
    uint8_t* dyt = D_.fp8_wgrad ? s.f8_dyt : nullptr;
    MT_PROF("bwd.fp8_cast", cuda::fp8_quantize_1x128(dy, T, out, grad, s.f8_row, s.f8_row_scale, dyt, dyt ? s.f8_dyt_scale : nullptr, stream_));
    MT_PROF(name, lt.gemm_fp8(T, in, out, 1.0f, s.f8_row, fp8_data_type(grad), s.f8_row_scale, f8_wqt_[k], CUDA_R_8F_E4M3, f8_wtscale_[k], 0.0f, dx, in,
                              CUDA_R_16BF, nullptr, false, stream_, Mode::kVec128, Mode::kBlock128));
    fp8_dyt_record_ = D_.fp8_wgrad ? &r : nullptr;
    fp8_dyt_site_ = site;
    return;
  }
  if (dy_cast && !f8_scale_) throw std::logic_error("CUDA model: an FP8 output gradient cast by its producer without delayed scaling");
  if (f8_scale_) {
    if (!dy_cast) {
      const cuda::Fp8CastTarget t = fp8_grad_target(l, site);
      MT_PROF("bwd.fp8_cast", cuda::fp8_cast_scaled(dy, T, out, t.scale, t.amax_accumulator, t.type, t.out, t.out_t, t.scale_inv, stream_));
    }
  } else {
    MT_PROF("bwd.fp8_cast", cuda::fp8_amax(dy, T * out, s.f8_scalar(2), stream_));
    if (fp8_tp_sharded(site, true)) fp8_amax_over_tp(s.f8_scalar(2));
    MT_PROF("bwd.fp8_cast", cuda::fp8_cast(dy, T, out, s.f8_scalar(2), grad, s.f8_row, D_.fp8_wgrad ? s.f8_dyt : nullptr, s.f8_scalar(3), stream_));
  }
  const auto k = static_cast<size_t>(l * kFp8Sites + site);  // W^T from the iteration's cast (the forward's)
  MT_PROF(name, lt.gemm_fp8(T, in, out, 1.0f, s.f8_row, fp8_data_type(grad), s.f8_scalar(3), f8_wqt_[k], CUDA_R_8F_E4M3, f8_winv_ + 64 * k, 0.0f, dx, in,
                            CUDA_R_16BF, nullptr, false, stream_));
  fp8_dyt_record_ = D_.fp8_wgrad ? &r : nullptr;
  fp8_dyt_site_ = site;
}

void CudaGPT::linear_wgrad(cudaStream_t ws, int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* dy,
                           const bf16* x, int64_t w_off, int64_t b_off) {
  if (!fp8_layer(l) || !D_.fp8_wgrad) {
    if (x == nullptr) throw std::logic_error(std::string("CUDA model: ") + name + " in 16 bits without its 16-bit input (not kept)");
    wgrad_with_bias(ws, name, out, T, dy, x, in, w_off, b_off);
    return;
  }
  Scratch& s = *s_;
  const auto grad = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3;
  const float beta = wgrad_beta(w_off);
  if (D_.fp8_blockwise) {  // dy^T and x^T, both in blocks of 128 tokens
    using Mode = cuda::GemmLt::ScaleMode;
    if (fp8_dyt_record_ != &r || fp8_dyt_site_ != site) {  // a deferred weight gradient: dy quantised again (the same bytes)
      MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_quantize_1x128(dy, T, out, grad, nullptr, nullptr, s.f8_dyt, s.f8_dyt_scale, ws));
    }
    MT_PROF_ON(ws, name, cuda::GemmLt::instance().gemm_fp8(out, in, T, 1.0f, s.f8_dyt, fp8_data_type(grad), s.f8_dyt_scale, r.f8_xt[site], CUDA_R_8F_E4M3,
                                                           r.f8_xt_scale[site], beta, g(w_off), in, CUDA_R_32F, nullptr, false, ws, Mode::kVec128,
                                                           Mode::kVec128));
    if (b_off >= 0) MT_PROF_ON(ws, "bwd.bias_grad", cuda::bias_grad_bf16(g(b_off), dy, T, out, ws, dt_));
    fp8_dyt_record_ = nullptr;
    return;
  }
  if (fp8_dyt_record_ != &r || fp8_dyt_site_ != site) {  // a deferred weight gradient: dy's cast again (the same scale, the same bytes)
    if (f8_scale_) {
      const float* scale = fp8_slot_scales(true) + fp8_scaling_slot(l, site);
      MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_cast_scaled(dy, T, out, scale, nullptr, grad, nullptr, s.f8_dyt, s.f8_scalar(3), ws));
    } else {
      // (A deferred recast of a TP-sharded output gradient would need its amax over TP on this stream: under TP an FP8
      // layer defers no weight gradient, and ZB-H1 is refused with tensorwise FP8 under TP.)
      if (fp8_tp_sharded(site, true)) throw std::logic_error("CUDA model: a deferred FP8 weight gradient of a TP-sharded output gradient");
      MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_amax(dy, T * out, s.f8_scalar(2), ws));
      MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_cast(dy, T, out, s.f8_scalar(2), grad, nullptr, s.f8_dyt, s.f8_scalar(3), ws));
    }
  }
  MT_PROF_ON(ws, name, cuda::GemmLt::instance().gemm_fp8(out, in, T, 1.0f, s.f8_dyt, fp8_data_type(grad), s.f8_scalar(3), r.f8_xt[site], CUDA_R_8F_E4M3,
                                                         r.f8_xinv + 64 * site, beta, g(w_off), in, CUDA_R_32F, nullptr, false, ws));
  if (b_off >= 0) MT_PROF_ON(ws, "bwd.bias_grad", cuda::bias_grad_bf16(g(b_off), dy, T, out, ws, dt_));
  fp8_dyt_record_ = nullptr;
}

}  // namespace mt
