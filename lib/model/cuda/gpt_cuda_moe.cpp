// gpt_cuda_moe.cpp: an MoE layer's MLP slot on the CUDA engine, one GPU with every expert local: the router, the
// top-k choice and the load-balancing and z losses (kernels/cuda/moe.cu), the choices permuted into expert-major rows,
// one cuBLASLt GEMM pair per expert over its rows (their counts read back from the device first: the GEMMs' sizes,
// as Megatron's dropless dispatch reads them), the weighted combine, the shared expert, and the backward of each. The CPU engine's
// model/cpu/moe_unit.cpp is the oracle.
#include "model/cuda/gpt_cuda_state.h"

#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/moe.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

void CudaGPT::moe_forward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, h = D.h, E = experts_, Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
  const cuda::MoeRouting rt{T, E, topk_, h, moe_sigmoid_, moe_pre_softmax_, moe_scaling_, moe_groups_, moe_group_topk_, moe_seq_aux_ ? mb.S : 0};
  MT_PROF("fwd.moe.router", cuda::moe_router_logits(r.logits, r.xn2, w(lw.router_w), rt, stream_));
  MT_PROF("fwd.moe.route", cuda::moe_route(r.top, r.route_weight, r.logits, rt, stream_));
  MT_PROF("fwd.moe.permute", cuda::moe_permute(r.row, s.counts, s.offsets, r.top, rt, stream_));
  // The aux loss's gradient per score and the statistics (a training forward; a recompute only recomputes the former).
  const bool zloss = moe_z_coeff_ > 0;
  if (moe_aux_ || zloss) {
    MT_PROF("fwd.moe.aux", cuda::moe_aux_stats(s.scores, s.counts_aux, s.probsum, s.zsum, r.logits, rt, stream_));
  }
  if (moe_aux_ || moe_record_stats_) {
    MT_PROF("fwd.moe.aux", cuda::moe_aux_finish(r.aux_dscale, moe_record_stats_ ? moe_acc_ + lw.moe_index * (2 + E) : nullptr, s.counts_aux, s.probsum,
                                                 s.zsum, s.counts, moe_aux_coeff_, moe_aux_, zloss, rt, stream_,
                                                 moe_global_ ? moe_global_ + lw.moe_index * (E + 1) : nullptr, moe_record_stats_));
  }
  MT_PROF("fwd.moe.gather", cuda::moe_gather(r.ex_rows, r.xn2, r.row, rt, stream_));
  // The rows per expert: the GEMMs' sizes, on the host.
  MT_PROF("fwd.moe.counts", MT_CUDA_CHECK(cudaMemcpyAsync(s.counts_host, s.counts, static_cast<size_t>(E) * 4, cudaMemcpyDeviceToHost, stream_)));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  r.per_expert.assign(s.counts_host, s.counts_host + E);
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.per_expert[static_cast<size_t>(e)];
    if (n > 0) {
      bf16* fc1 = r.ex_fc1 + off * F1m;
      bf16* act = r.ex_act + off * Fm;
      if (D.swiglu) {
        MT_PROF("fwd.moe.gemm.fc1", lt.gemm_ex(false, true, n, F1m, h, 1.0f, r.ex_rows + off * h, h, w(lw.expert_fc1[static_cast<size_t>(e)]), h, 0.0f, fc1,
                                               F1m, ab_, ab_, nullptr, stream_));
        MT_PROF("fwd.moe.activation", cuda::swiglu_forward_bf16(act, fc1, n, Fm, stream_, dt_));
      } else {
        MT_PROF("fwd.moe.gemm.fc1", lt.gemm_ex(false, true, n, Fm, h, 1.0f, r.ex_rows + off * h, h, w(lw.expert_fc1[static_cast<size_t>(e)]), h, 0.0f, act,
                                               Fm, ab_, ab_, nullptr, stream_, {cuda::GemmEpilogue::kGeluAux, fc1, Fm}));
      }
      MT_PROF("fwd.moe.gemm.fc2", lt.gemm_ex(false, true, n, h, Fm, 1.0f, act, Fm, w(lw.expert_fc2[static_cast<size_t>(e)]), Fm, 0.0f, r.ex_out + off * h, h,
                                             ab_, ab_, nullptr, stream_));
    }
    off += n;
  }
  MT_PROF("fwd.moe.combine", cuda::moe_combine(s.delta, r.ex_out, r.row, r.route_weight, rt, stream_));
  if (lw.shared_fc1_w >= 0) shared_expert_forward(lw, r, T);
}

// As the dense MLP, without biases (MoE layers have none here): fc1, the activation, and fc2 accumulated onto the
// routed output (C = s.delta: one rounding of their fp32 sum to 16 bits).
void CudaGPT::shared_expert_forward(const LayerW& lw, Record& r, int64_t T) {
  const ModelDims& D = D_;
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t h = D.h, Fs = F_shared_, F1s = D.swiglu ? 2 * F_shared_ : F_shared_;
  if (D.swiglu) {
    MT_PROF("fwd.moe.shared.gemm.fc1", lt.gemm_ex(false, true, T, F1s, h, 1.0f, r.xn2, h, w(lw.shared_fc1_w), h, 0.0f, r.sh_fc1, F1s, ab_, ab_, nullptr, stream_));
    MT_PROF("fwd.moe.shared.activation", cuda::swiglu_forward_bf16(r.sh_act, r.sh_fc1, T, Fs, stream_, dt_));
  } else {
    MT_PROF("fwd.moe.shared.gemm.fc1", lt.gemm_ex(false, true, T, Fs, h, 1.0f, r.xn2, h, w(lw.shared_fc1_w), h, 0.0f, r.sh_act, Fs, ab_, ab_, nullptr,
                                                  stream_, {cuda::GemmEpilogue::kGeluAux, r.sh_fc1, Fs}));
  }
  MT_PROF("fwd.moe.shared.gemm.fc2", lt.gemm_ex(false, true, T, h, Fs, 1.0f, r.sh_act, Fs, w(lw.shared_fc2_w), Fs, 1.0f, s.delta, h, ab_, ab_, nullptr, stream_));
}

void CudaGPT::shared_expert_backward(const LayerW& lw, Record& r, const bf16* dy, int64_t T) {
  const ModelDims& D = D_;
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t h = D.h, Fs = F_shared_, F1s = D.swiglu ? 2 * F_shared_ : F_shared_;
  if (D.swiglu) {
    MT_PROF("bwd.moe.shared.gemm.fc2_dgrad", lt.gemm_ex(false, false, T, Fs, h, 1.0f, dy, h, w(lw.shared_fc2_w), Fs, 0.0f, s.sh_dact, Fs, ab_, ab_, nullptr, stream_));
  } else {
    MT_PROF("bwd.moe.shared.gemm.fc2_dgrad", lt.gemm_ex(false, false, T, Fs, h, 1.0f, dy, h, w(lw.shared_fc2_w), Fs, 0.0f, s.sh_dfc1, Fs, ab_, ab_, nullptr,
                                                        stream_, {cuda::GemmEpilogue::kDGelu, r.sh_fc1, Fs}));
  }
  wgrad_with_bias(stream_, "bwd.moe.shared.gemm.fc2_wgrad", h, T, dy, r.sh_act, Fs, lw.shared_fc2_w, -1);
  if (D.swiglu) MT_PROF("bwd.moe.shared.activation", cuda::swiglu_backward_bf16(s.sh_dfc1, s.sh_dact, r.sh_fc1, T, Fs, stream_, dt_));
  // (added onto the routed experts' and the router's input gradient)
  MT_PROF("bwd.moe.shared.gemm.fc1_dgrad", lt.gemm_ex(false, false, T, h, F1s, 1.0f, s.sh_dfc1, F1s, w(lw.shared_fc1_w), h, 1.0f, s.dxn, h, ab_, ab_, nullptr, stream_));
  wgrad_with_bias(stream_, "bwd.moe.shared.gemm.fc1_wgrad", F1s, T, s.sh_dfc1, r.xn2, h, lw.shared_fc1_w, -1);
}

void CudaGPT::moe_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, const bf16* dy) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  auto& lt = cuda::GemmLt::instance();
  const int64_t T = mb.B * mb.S, h = D.h, E = experts_, Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
  const cuda::MoeRouting rt{T, E, topk_, h, moe_sigmoid_, moe_pre_softmax_, moe_scaling_, moe_groups_, moe_group_topk_, moe_seq_aux_ ? mb.S : 0};
  MT_PROF("bwd.moe.combine", cuda::moe_combine_backward(s.ex_dout, s.dweight, dy, r.ex_out, r.row, r.route_weight, rt, stream_));
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.per_expert[static_cast<size_t>(e)];
    if (n > 0) {
      const bf16* dout = s.ex_dout + off * h;
      bf16* dfc1 = s.ex_dfc1 + off * F1m;
      const int64_t fc2 = lw.expert_fc2[static_cast<size_t>(e)], fc1 = lw.expert_fc1[static_cast<size_t>(e)];
      if (D.swiglu) {
        MT_PROF("bwd.moe.gemm.fc2_dgrad", lt.gemm_ex(false, false, n, Fm, h, 1.0f, dout, h, w(fc2), Fm, 0.0f, s.ex_dact + off * Fm, Fm, ab_, ab_, nullptr, stream_));
      } else {  // the GELU backward in the epilogue, straight to d(fc1 output)
        MT_PROF("bwd.moe.gemm.fc2_dgrad", lt.gemm_ex(false, false, n, Fm, h, 1.0f, dout, h, w(fc2), Fm, 0.0f, dfc1, Fm, ab_, ab_, nullptr, stream_,
                                                     {cuda::GemmEpilogue::kDGelu, r.ex_fc1 + off * F1m, Fm}));
      }
      wgrad_with_bias(stream_, "bwd.moe.gemm.fc2_wgrad", h, n, dout, r.ex_act + off * Fm, Fm, fc2, -1);
      if (D.swiglu) MT_PROF("bwd.moe.activation", cuda::swiglu_backward_bf16(dfc1, s.ex_dact + off * Fm, r.ex_fc1 + off * F1m, n, Fm, stream_, dt_));
      MT_PROF("bwd.moe.gemm.fc1_dgrad", lt.gemm_ex(false, false, n, h, F1m, 1.0f, dfc1, F1m, w(fc1), h, 0.0f, s.ex_din + off * h, h, ab_, ab_, nullptr, stream_));
      wgrad_with_bias(stream_, "bwd.moe.gemm.fc1_wgrad", F1m, n, dfc1, r.ex_rows + off * h, h, fc1, -1);
    }
    off += n;
  }
  // The router: through the weights, plus the aux and z losses' gradients at the lm loss's scale.
  MT_PROF("bwd.moe.router", cuda::moe_router_backward(s.dlogits, r.logits, r.top, s.dweight, moe_aux_ ? r.aux_dscale : nullptr, moe_z_coeff_,
                                                      mb.aux_grad_scale, rt, stream_));
  MT_PROF("bwd.moe.input", cuda::moe_input_backward(s.dxn, s.ex_din, r.row, s.dlogits, w(lw.router_w), rt, stream_));
  MT_PROF("bwd.moe.router_wgrad", cuda::moe_router_wgrad(g(lw.router_w), s.wgrad_parts, s.dlogits, r.xn2, rt, stream_));
  if (lw.shared_fc1_w >= 0) shared_expert_backward(lw, r, dy, T);
}

}  // namespace mt
