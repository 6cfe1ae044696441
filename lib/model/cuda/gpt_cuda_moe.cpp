// gpt_cuda_moe.cpp: the MoE layers on the CUDA engine (every expert on this rank, or this EP rank's; under TP each
// expert's shards of expert-TP = TP, over the TP group's gathered rows, the output a partial sum that the layer reduces
// over TP as the dense MLP's: Megatron's allgather dispatch over TP): their set-up and device state
// (statistics, expert bias), and an MoE layer's MLP slot: the router, the top-k choice and the load-balancing and z
// losses (kernels/cuda/moe.cu), the choices permuted into expert-major rows, one cuBLASLt GEMM pair per expert over its
// rows (their counts read back from the device first: the GEMMs' sizes, as Megatron's dropless dispatch reads them),
// the weighted combine, the shared expert, and the backward of each. The CPU engine's model/cpu/moe_unit.cpp is the
// oracle.
#include "model/cuda/gpt_cuda_state.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/router.h"
#include "kernels/cuda/activation_bf16.h"
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/fp8_block.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_quantile.h"
#include "model/moe_input_jitter.h"
#include "model/moe_random_logits.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

// The MoE layers' settings, the device state they keep (the statistics, the running counts of global_aux_loss, each
// layer's expert bias from the layout's values) and the experts' streams.
void CudaGPT::setup_moe(const MoeConfig& m, const ParamStore& layout, int64_t max_in_flight, uint64_t seed) {
  const ModelDims& D = D_;
  experts_ = D.experts;
  topk_ = D.topk;
  F_moe_ = D.F_moe_local;
  F_shared_ = D.F_shared_local;
  moe_sigmoid_ = m.moe_router_score_function == "sigmoid" || m.moe_router_score_function == "sqrtsoftplus";  // (element-wise scores)
  moe_sqrtsoftplus_ = m.moe_router_score_function == "sqrtsoftplus";
  moe_pre_softmax_ = m.moe_router_pre_softmax;
  moe_router_fp64_ = m.moe_router_dtype == "fp64";
  moe_force_balance_ = m.moe_router_force_load_balancing;
  moe_random_key_ = moe_random_logits_key(seed);
  if (moe_force_balance_ && D.cp > 1) throw std::logic_error("CUDA model: --moe-router-force-load-balancing with CP (refused by the capability checks)");
  moe_jitter_eps_ = static_cast<float>(m.moe_input_jitter_eps.value_or(0.0));
  moe_jitter_key_ = moe_input_jitter_key(seed);
  if (moe_jitter_eps_ > 0 && D.cp > 1) throw std::logic_error("CUDA model: --moe-input-jitter-eps with CP (refused by the capability checks)");
  moe_groups_ = m.moe_router_num_groups.value_or(0);
  moe_group_topk_ = m.moe_router_group_topk.value_or(0);
  moe_scaling_ = m.moe_router_topk_scaling_factor ? static_cast<float>(*m.moe_router_topk_scaling_factor) : 1.0f;
  // The load-balancing losses: each type with a coefficient (Megatron's list form may give several), each computed from
  // the same scores and their gradients summed.
  for (size_t i = 0; i < 3; ++i) moe_aux_coeffs_[i] = static_cast<float>(m.aux_loss_coeff(kAuxLossTypes[i]));
  moe_aux_ = moe_aux_coeffs_[0] > 0 || moe_aux_coeffs_[1] > 0 || moe_aux_coeffs_[2] > 0;
  moe_seq_aux_ = moe_aux_coeffs_[1] > 0;
  if (m.load_balancing_is("quantile_balancing") && D.cp > 1) throw std::logic_error("CUDA model: quantile_balancing with CP (refused by the capability checks)");
  moe_sinkhorn_ = m.load_balancing_is("sinkhorn");
  shared_gate_ = m.moe_shared_expert_gate && F_shared_ > 0;
  if (moe_sinkhorn_) {  // (Megatron's sinkhorn_load_balancing: sigmoid at top-1, else the softmax over all experts; as the CPU engine's)
    if (D.cp > 1) throw std::logic_error("CUDA model: sinkhorn routing with CP (refused by the capability checks)");
    moe_sigmoid_ = topk_ == 1;
    moe_sqrtsoftplus_ = false;
    moe_pre_softmax_ = topk_ > 1;
    moe_scaling_ = 1.0f;
    moe_groups_ = moe_group_topk_ = 0;
  }
  moe_capacity_factor_ = m.moe_expert_capacity_factor.value_or(0.0);
  moe_drop_by_probability_ = m.moe_token_drop_policy == "probs";
  moe_pad_ = moe_capacity_factor_ > 0 && m.moe_pad_expert_input_to_capacity;
  moe_probs_on_input_ = m.moe_apply_probs_on_input;
  if (moe_probs_on_input_ && (moe_pad_ || D.ep > 1)) {
    throw std::logic_error("CUDA model: --moe-apply-probs-on-input with padding to capacity or expert parallelism (refused by the capability checks)");
  }
  if (moe_aux_coeffs_[2] > 0) {  // global_aux_loss's running counts
    if (max_in_flight > 1) throw std::logic_error("CUDA model: global_aux_loss with several microbatches in flight is not implemented");
    const size_t bytes = static_cast<size_t>(moe_layers_ * (experts_ + 1)) * 4;
    moe_global_ = static_cast<float*>(alloc(bytes));
    MT_CUDA_CHECK(cudaMemsetAsync(moe_global_, 0, bytes, stream_));
  }
  int64_t streams = 4;
  if (const char* env = std::getenv("MEGATRAIN_MOE_EXPERT_STREAMS")) {
    streams = std::atoll(env);
    if (streams < 1 || streams > 64) throw std::runtime_error("MEGATRAIN_MOE_EXPERT_STREAMS must be a number of streams from 1 to 64");
  }
  streams = std::min(streams, D.experts_local);
  if (streams > 1) {
    expert_streams_.resize(static_cast<size_t>(streams));
    expert_done_ev_.resize(static_cast<size_t>(streams));
    for (int64_t i = 0; i < streams; ++i) {
      MT_CUDA_CHECK(cudaStreamCreateWithFlags(&expert_streams_[static_cast<size_t>(i)], cudaStreamNonBlocking));
      MT_CUDA_CHECK(cudaEventCreateWithFlags(&expert_done_ev_[static_cast<size_t>(i)], cudaEventDisableTiming));
    }
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&experts_fork_ev_, cudaEventDisableTiming));
  }
  moe_z_coeff_ = static_cast<float>(m.moe_z_loss_coeff.value_or(0.0));
  const size_t acc = static_cast<size_t>(moe_layers_ * moe_stats_row()) * 4;
  moe_acc_ = static_cast<float*>(alloc(acc));
  MT_CUDA_CHECK(cudaMemsetAsync(moe_acc_, 0, acc, stream_));
  // A vector of E fp32 values per MoE layer (every layer has one, or none does), from the layout's values, on the device.
  auto upload_per_layer = [&](const std::vector<int64_t>& offsets, const char* what) -> float* {
    if (offsets.empty()) return nullptr;
    if (static_cast<int64_t>(offsets.size()) != moe_layers_) throw std::logic_error(std::string("CUDA model: ") + what + " in some MoE layers only");
    std::vector<float> values(static_cast<size_t>(moe_layers_ * experts_));
    for (int64_t l = 0; l < moe_layers_; ++l) {
      const float* from = layout.params().f32() + offsets[static_cast<size_t>(l)];
      std::copy(from, from + experts_, values.begin() + l * experts_);
    }
    float* device = static_cast<float*>(alloc(values.size() * 4));
    MT_CUDA_CHECK(cudaMemcpy(device, values.data(), values.size() * 4, cudaMemcpyHostToDevice));
    return device;
  };
  expert_bias_ = upload_per_layer(expert_bias_offsets_, "an expert bias");
  quantile_bias_ = upload_per_layer(quantile_bias_offsets_, "a qb_beta");
  if (quantile_bias_) {  // quantile_balancing: the quantiles' sums
    const size_t bytes = static_cast<size_t>(moe_layers_ * (experts_ + 1)) * 4;
    quantile_acc_ = static_cast<float*>(alloc(bytes));
    MT_CUDA_CHECK(cudaMemsetAsync(quantile_acc_, 0, bytes, stream_));
  }
}

std::vector<int64_t> CudaGPT::moe_layer_indices() const {
  std::vector<int64_t> out(static_cast<size_t>(moe_layers_), -1);
  for (int64_t l = 0; l < L_; ++l) {
    const LayerW& lw = layers_[static_cast<size_t>(l)];
    if (lw.moe) out[static_cast<size_t>(lw.moe_index)] = first_layer_ + l;
  }
  return out;
}

int64_t CudaGPT::moe_stats_row() const { return cuda::kMoeStatsHead + D_.experts; }  // (D_'s: a chunk without MoE layers has no experts_)

void CudaGPT::zero_moe_stats() {
  if (moe_acc_) MT_CUDA_CHECK(cudaMemsetAsync(moe_acc_, 0, static_cast<size_t>(moe_layers_ * moe_stats_row()) * 4, stream_));
  if (moe_global_) MT_CUDA_CHECK(cudaMemsetAsync(moe_global_, 0, static_cast<size_t>(moe_layers_ * (experts_ + 1)) * 4, stream_));
}

void CudaGPT::sum_moe_stats(StreamCollectives& group) {
  if (moe_acc_) group.all_reduce_on(moe_acc_, moe_layers_ * moe_stats_row(), WireType::kF32, ReduceOp::kSum, stream_);
  if (quantile_acc_) group.all_reduce_on(quantile_acc_, moe_layers_ * (experts_ + 1), WireType::kF32, ReduceOp::kSum, stream_);
}

void CudaGPT::update_expert_biases(float rate) {
  if (expert_bias_) cuda::moe_update_expert_bias(expert_bias_, moe_acc_, moe_layers_, experts_, rate, stream_);
}

void CudaGPT::update_quantile_biases(double ema) {
  if (quantile_bias_) cuda::moe_update_quantile_bias(quantile_bias_, quantile_acc_, moe_layers_, experts_, ema, stream_);
}

void CudaGPT::download_router_biases(ParamStore& host) const {
  const auto download = [&](const float* device, const std::vector<int64_t>& offsets) {
    if (!device) return;
    std::vector<float> values(static_cast<size_t>(moe_layers_ * experts_));
    MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    MT_CUDA_CHECK(cudaMemcpy(values.data(), device, values.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t l = 0; l < moe_layers_; ++l) {
      std::copy(values.begin() + l * experts_, values.begin() + (l + 1) * experts_, host.params().f32() + offsets[static_cast<size_t>(l)]);
    }
  };
  download(expert_bias_, expert_bias_offsets_);
  download(quantile_bias_, quantile_bias_offsets_);
}

cuda::MoeRouting CudaGPT::moe_routing(const DeviceMicrobatch& mb) const {
  cuda::MoeRouting rt{mb.B * mb.S, experts_, topk_, D_.h, moe_sigmoid_, moe_pre_softmax_, moe_scaling_, moe_groups_, moe_group_topk_, moe_seq_aux_ ? mb.S : 0, D_.cp};
  rt.sqrtsoftplus = moe_sqrtsoftplus_;
  rt.row_align = moe_row_align_;
  return rt;
}

cuda::MoeJitter CudaGPT::moe_jitter(int64_t l, const DeviceMicrobatch& mb) const {
  return cuda::MoeJitter{moe_jitter_key_, moe_jitter_eps_, first_layer_ + l, mb.first_sample, D_.S};
}

void CudaGPT::moe_forward(int64_t l, Record& r, const DeviceMicrobatch& mb) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S, h = D.h, E = experts_, Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
  const cuda::MoeRouting rt = moe_routing(mb);
  // The router's logits as one cuBLASLt GEMM (16-bit inputs, fp32 accumulation and output) where it has an algorithm for
  // E fp32 columns, else a warp per logit.
  auto& lt = cuda::GemmLt::instance();
  // (--moe-input-jitter-eps: the router reads the norm output times its noise; the experts read it as it is)
  const bf16* router_in = r.xn2;
  if (moe_jitter_eps_ > 0) {
    MT_PROF("fwd.moe.router", cuda::moe_jitter_router_input(s.router_input, r.xn2, rt, moe_jitter(l, mb), stream_, dt_));
    router_in = s.router_input;
  }
  if (moe_router_fp64_) {  // (the bias inside the double sum, as the CPU engine's)
    MT_PROF("fwd.moe.router", cuda::moe_router_logits_fp64(r.logits, router_in, w(lw.router_w), w(lw.router_b), rt, stream_, dt_));
  } else if (lt.has_algorithm(false, true, T, E, h, h, h, E, ab_, CUDA_R_32F, {})) {
    MT_PROF("fwd.moe.router", lt.gemm_ex(false, true, T, E, h, 1.0f, router_in, h, w(lw.router_w), h, 0.0f, r.logits, E, ab_, CUDA_R_32F, nullptr, stream_));
  } else {
    MT_PROF("fwd.moe.router", cuda::moe_router_logits(r.logits, router_in, w(lw.router_w), rt, stream_, dt_));
  }
  if (lw.router_b >= 0 && !moe_router_fp64_) MT_PROF("fwd.moe.router", cuda::moe_router_bias(r.logits, w(lw.router_b), rt, stream_, dt_));
  // (the backward then takes them for the router's: the gradient straight through, as Megatron's)
  if (moe_force_balance_) {  // (rows in their natural order, whole sequences: CP is refused in setup_moe)
    MT_PROF("fwd.moe.router", cuda::moe_random_logits(r.logits, rt, moe_random_key_, first_layer_ + l, mb.first_sample, D.S, stream_));
  }
  // (sinkhorn routing in training: the normalised logits choose; rows in their natural order, whole sequences)
  const bool sinkhorn = moe_sinkhorn_ && moe_training_;
  if (sinkhorn) MT_PROF("fwd.moe.route", cuda::moe_sinkhorn(s.sinkhorn, s.sinkhorn + T * E, r.logits, rt, stream_));
  // (quantile_balancing: the top k of logits - qb_beta choose, written into s.scores; a training forward adds the
  // microbatch's quantiles for the iteration's update)
  const bool quantile = quantile_bias_ != nullptr;
  if (quantile) {
    MT_PROF("fwd.moe.route", cuda::moe_quantile_scores(s.scores, moe_record_stats_ ? s.quantile_shifted : nullptr, r.logits,
                                                       quantile_bias_ + lw.moe_index * E, rt, stream_));
    if (moe_record_stats_) MT_PROF("fwd.moe.route", cuda::moe_quantile_accumulate(quantile_acc_ + lw.moe_index * (E + 1), s.quantile_shifted, rt, stream_));
  }
  MT_PROF("fwd.moe.route", cuda::moe_route(r.top, r.route_weight, r.logits, rt, stream_, expert_bias_ ? expert_bias_ + lw.moe_index * E : nullptr,
                                           sinkhorn ? s.sinkhorn : quantile ? s.scores : nullptr));
  // A capacity that drops, or this TP rank's slice of the rows (expert-TP other than TP): the host's rows and kept counts
  // (before the statistics read them), else the permutation's.
  const bool host_rows = (moe_capacity_factor_ > 0 || moe_own_rows_) && moe_capacity(r, T, mb.S);
  if (!host_rows) MT_PROF("fwd.moe.permute", cuda::moe_permute(r.row, s.counts, s.offsets, s.permute_parts, r.top, rt, stream_));
  // The aux losses' gradient per score and the statistics (a training forward; a recompute only recomputes the former).
  // seq_aux_loss's statistics per sequence (rt), the batch-level types' over the microbatch (batch; in their own buffers
  // when both are chosen); the z-loss's sum comes with either.
  const bool zloss = moe_z_coeff_ > 0;
  const bool batch_types = moe_aux_coeffs_[0] > 0 || moe_aux_coeffs_[2] > 0;
  cuda::MoeRouting batch = rt;
  batch.seq_len = 0;
  float* counts_batch = moe_seq_aux_ ? s.counts_aux_batch : s.counts_aux;
  float* probsum_batch = moe_seq_aux_ ? s.probsum_batch : s.probsum;
  if (moe_aux_ || zloss) {
    if (moe_seq_aux_) MT_PROF("fwd.moe.aux", cuda::moe_aux_stats(s.scores, s.counts_aux, s.probsum, s.zsum, r.logits, rt, stream_));
    if (batch_types || !moe_seq_aux_) MT_PROF("fwd.moe.aux", cuda::moe_aux_stats(s.scores, counts_batch, probsum_batch, s.zsum, r.logits, batch, stream_));
    // Context parallelism: the statistics over the whole sequences, every CP rank's share (Megatron's counts over the
    // tp_cp group; as the CPU engine's sum_over_microbatch). Each rank's gradient stays its own tokens'.
    if (D.cp > 1) {
      if (!cp_) throw std::logic_error("CudaGPT: context parallelism without its group (set_context_parallel)");
      cp_->group_start();
      if (moe_seq_aux_) {
        cp_->all_reduce_on(s.counts_aux, rt.balance_groups() * E, WireType::kF32, ReduceOp::kSum, stream_);
        cp_->all_reduce_on(s.probsum, rt.balance_groups() * E, WireType::kF32, ReduceOp::kSum, stream_);
      }
      if (batch_types || !moe_seq_aux_) {
        cp_->all_reduce_on(counts_batch, E, WireType::kF32, ReduceOp::kSum, stream_);
        cp_->all_reduce_on(probsum_batch, E, WireType::kF32, ReduceOp::kSum, stream_);
      }
      cp_->all_reduce_on(s.zsum, 1, WireType::kF32, ReduceOp::kSum, stream_);
      MT_PROF("cp.moe_statistics", cp_->group_end());
    }
  }
  float* acc = moe_record_stats_ ? moe_acc_ + lw.moe_index * moe_stats_row() : nullptr;
  bool first_type = true;  // (the first chosen type writes the gradient per score, the others add theirs)
  for (size_t i = 0; i < 3; ++i) {
    if (moe_aux_coeffs_[i] <= 0) continue;
    const bool per_sequence = i == 1, global = i == 2;
    MT_PROF("fwd.moe.aux", cuda::moe_balance_finish(r.aux_dscale, rt.balance_groups(), !first_type, acc ? acc + i : nullptr,
                                                     per_sequence ? s.counts_aux : counts_batch, per_sequence ? s.probsum : probsum_batch,
                                                     moe_aux_coeffs_[i], per_sequence ? rt : batch, stream_,
                                                     global ? moe_global_ + lw.moe_index * (E + 1) : nullptr, moe_record_stats_));
    first_type = false;
  }
  if (acc) MT_PROF("fwd.moe.aux", cuda::moe_stats_finish(acc, s.zsum, s.counts, zloss, rt, stream_));
  MT_PROF("fwd.moe.gather", cuda::moe_gather(r.ex_rows, r.xn2, r.row, rt, stream_, dt_, moe_probs_on_input_ ? r.route_weight : nullptr));
  if (host_rows && r.pads > 0) MT_PROF("fwd.moe.gather", cuda::moe_pad_rows(r.ex_rows, r.xn2, r.pad_map, r.pads, h, stream_, dt_));
  // The rows per expert: the GEMMs' sizes, on the host (with a capacity, already there).
  if (!host_rows) {
    MT_PROF("fwd.moe.counts", MT_CUDA_CHECK(cudaMemcpyAsync(s.counts_host, s.counts, static_cast<size_t>(E) * 4, cudaMemcpyDeviceToHost, stream_)));
    host_wait("the MoE layer's expert counts");
    r.per_expert.assign(s.counts_host, s.counts_host + E);
  }
  // This rank's experts' rows: its own choices', or under expert parallelism what every EP rank sends them, and with
  // expert-TP other than TP (more than one rank) what every expert-TP rank has, gathered.
  bf16 *rows = r.ex_rows, *fc1 = r.ex_fc1, *act = r.ex_act, *out = r.ex_out;
  bf16* local_out = r.ex_out;  // (this rank's rows' outputs, before the way back over EP)
  const bool f8 = fp8_layer(l), act_recomputed = expert_act_recomputed(l);
  if (moe_rows_travel()) {
    const auto idle = [this] { host_wait("the MoE layer's expert buffers"); };
    int64_t R = 0;
    for (int32_t n : r.per_expert) R += n;
    if (D.ep > 1) {
      // (FP8 models, every MoE layer's rows aligned to 16, even a bf16 one's: the padded blocks travel, their gaps zero)
      if (moe_row_align_ > 1) zero_expert_padding(r.ex_rows, h, r.per_expert, stream_);
      R = ep_dispatch(r);
      rows = r.ep_rows.get<bf16>();
      local_out = s.ep_out.need<bf16>(static_cast<size_t>(std::max<int64_t>(R, 1) * h) * 2, idle);
    }
    if (moe_etp_gathers_) {
      R = etp_gather(r, rows, R);
      rows = r.etp_rows.get<bf16>();
    }
    fc1 = r.ep_fc1.need<bf16>(static_cast<size_t>(R * F1m) * 2, idle);
    act = (expert_act_shared(l) ? s.ep_act_shared : r.ep_act).need<bf16>(static_cast<size_t>(R * Fm) * 2, idle);
    out = moe_etp_gathers_ ? s.etp_out.need<bf16>(static_cast<size_t>(std::max<int64_t>(R, 1) * h) * 2, idle) : local_out;
    if (f8) expert_fp8_rows(r, R, true);
  }
  // FP8: each expert's rows padded with zero rows to a multiple of 16 (gpt_cuda_moe_fp8.cpp).
  if (f8) {
    zero_expert_padding(rows, h, r.per_expert, stream_);
    cast_idle_expert_fp8_weights(l, r.per_expert);
  }
  fork_experts();
  int64_t off = 0, busy = 0, blocks = 0;
  for (size_t e = 0; e < r.per_expert.size(); ++e) {
    const int64_t n = r.per_expert[e], rows_e = f8 ? align_rows(n) : n;
    if (n > 0) {
      const ExpertFp8 x8 = f8 ? expert_fp8(l, r, static_cast<int64_t>(e), off, blocks) : ExpertFp8{};
      bf16* act_e = act ? act + off * Fm : nullptr;  // (none under FP8 delayed scaling's fused SwiGLU)
      expert_forward(false, rows_e, Fm, rows + off * h, lw.expert_fc1[e], lw.expert_fc2[e], fc1 + off * F1m, act_e, out + off * h, 0.0f,
                     expert_stream(busy++), lw.expert_fc1_b[e], lw.expert_fc2_b[e], f8 ? &x8 : nullptr, n, act_recomputed);
    }
    off += align_rows(n);
    blocks += (rows_e + cuda::kFp8BlockSize - 1) / cuda::kFp8BlockSize;
  }
  join_experts();
  if (moe_etp_gathers_) etp_to_local(r, out, local_out, "fwd.moe.etp.scatter");
  if (D.ep > 1) ep_to_owners(r, local_out, r.ex_out, "fwd.moe.ep.combine");
  MT_PROF("fwd.moe.combine", cuda::moe_combine(s.delta, r.ex_out, r.row, moe_probs_on_input_ ? moe_ones_ : r.route_weight, rt, stream_, dt_));
  if (lw.shared_fc1_w >= 0) {
    const ExpertFp8 x8 = f8 ? expert_fp8(l, r, E, 0, 0) : ExpertFp8{};
    if (lw.shared_gate_w >= 0) {  // (its output apart, then added times each token's gate: the same factor on every TP rank's partial sums)
      expert_forward(true, T, F_shared_, r.xn2, lw.shared_fc1_w, lw.shared_fc2_w, r.sh_fc1, r.sh_act, r.sh_out, 0.0f, stream_, -1, -1, f8 ? &x8 : nullptr, T);
      MT_PROF("fwd.moe.shared.gate", cuda::moe_shared_gate_forward(r.sh_gate, s.delta, r.sh_out, r.xn2, w(lw.shared_gate_w), T, h, stream_, dt_));
    } else {
      expert_forward(true, T, F_shared_, r.xn2, lw.shared_fc1_w, lw.shared_fc2_w, r.sh_fc1, r.sh_act, s.delta, 1.0f, stream_, -1, -1, f8 ? &x8 : nullptr, T);
    }
  }
}

bool CudaGPT::expert_act_shared(int64_t l) const {
  const auto k = static_cast<size_t>(l);
  return layers_[k].moe && !mlp_recompute_layer_[k] && (fp8_layer(l) || moe_act_recompute_);
}

bool CudaGPT::moe_capacity(Record& r, int64_t T, int64_t S) {
  const int64_t k = topk_, E = experts_, n = T * k;
  const int64_t capacity = moe_capacity_factor_ > 0 ? cpu::expert_capacity(moe_capacity_factor_, T, k, E) : T + 1;
  r.pads = 0;
  const bool drops = capacity <= T;  // Megatron: no dropping when every token fits
  if (!drops && !moe_own_rows_) return false;
  // (expert-TP other than TP: this TP rank's slice of the tokens, [first, last); the others' choices get no row here)
  const int64_t first = moe_own_rows_ ? T / tp_size_ * tp_rank_ : 0, last = moe_own_rows_ ? first + T / tp_size_ : T;
  capacity_top_.resize(static_cast<size_t>(n));
  capacity_weight_.resize(static_cast<size_t>(n));
  MT_PROF("fwd.moe.capacity", {
    MT_CUDA_CHECK(cudaMemcpyAsync(capacity_top_.data(), r.top, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
    MT_CUDA_CHECK(cudaMemcpyAsync(capacity_weight_.data(), r.route_weight, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
    host_wait("the MoE layer's capacity");
    if (capacity_order_size_ != std::make_pair(T, S)) {
      capacity_order_ = cpu::megatron_token_order(T, S);
      capacity_order_size_ = {T, S};
    }
    capacity_keep_.assign(static_cast<size_t>(n), 1);
    if (drops) {
      cpu::capacity_keep(capacity_top_.data(), capacity_weight_.data(), capacity_order_, k, E, capacity, moe_drop_by_probability_,
                         capacity_keep_.data());
    }
    // Padding to capacity: the tokens each expert takes beside its kept ones (Megatron's capacity mask, as the CPU
    // engine's). The kept counts, every token's, are the statistics'; the rows (expert-major, as moe_permute places
    // them, with the pads among them by token) only this rank's slice's.
    std::vector<std::vector<int64_t>> pads;
    if (moe_pad_ && drops) pads = cpu::capacity_padding(capacity_top_.data(), capacity_keep_.data(), capacity_order_, k, E, capacity);
    std::vector<int32_t> kept(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (capacity_keep_[static_cast<size_t>(i)]) ++kept[static_cast<size_t>(capacity_top_[static_cast<size_t>(i)])];
    }
    cpu::ExpertRows placed = cpu::place_expert_rows(capacity_top_.data(), capacity_keep_.data(), pads, T, k, E, first, last, moe_row_align_);
    r.per_expert = std::move(placed.per_expert);
    capacity_row_ = std::move(placed.row);
    capacity_pad_map_ = std::move(placed.pad_map);
    r.pads = static_cast<int64_t>(capacity_pad_map_.size() / 2);
    MT_CUDA_CHECK(cudaMemcpyAsync(r.row, capacity_row_.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
    MT_CUDA_CHECK(cudaMemcpyAsync(s_->counts, kept.data(), static_cast<size_t>(E) * 4, cudaMemcpyHostToDevice, stream_));
    if (r.pads > 0) {
      MT_CUDA_CHECK(cudaMemcpyAsync(r.pad_map, capacity_pad_map_.data(), capacity_pad_map_.size() * 4, cudaMemcpyHostToDevice, stream_));
    }
    // (the host copies are read again by the next MoE layer: the copies from pageable memory are staged before
    // cudaMemcpyAsync returns)
  });
  return true;
}

// A gated unit (SwiGLU, quick GeGLU), squared ReLU or GELU of n rows of an expert's fc1 output into act [n, F], and its backward from dact into dfc1.
void CudaGPT::expert_activation(const char* name, int64_t n, int64_t F, const bf16* fc1_out, bf16* act, cudaStream_t st) {
  if (D_.swiglu) MT_PROF_ON(st, name, cuda::glu_forward_bf16(act, fc1_out, n, F, D_.glu, st, dt_));
  else if (D_.squared_relu) MT_PROF_ON(st, name, cuda::squared_relu_forward_bf16(act, fc1_out, n * F, st, dt_));
  else MT_PROF_ON(st, name, cuda::gelu_forward_bf16(act, fc1_out, n * F, st, dt_, D_.gelu_erf));
}

void CudaGPT::expert_activation_backward(const char* name, int64_t n, int64_t F, const bf16* dact, const bf16* fc1_out, bf16* dfc1, cudaStream_t st) {
  if (D_.swiglu) MT_PROF_ON(st, name, cuda::glu_backward_bf16(dfc1, dact, fc1_out, n, F, D_.glu, st, dt_));
  else if (D_.squared_relu) MT_PROF_ON(st, name, cuda::squared_relu_backward_bf16(dfc1, dact, fc1_out, n * F, st, dt_));
  else MT_PROF_ON(st, name, cuda::gelu_backward_bf16(dfc1, dact, fc1_out, n * F, st, dt_, D_.gelu_erf));
}

// One expert's MLP over n rows of x: fc1 (+ b1), then SwiGLU, squared ReLU or GELU (GELU in fc1's epilogue) into
// fc1_out and act, and fc2 (+ b2) into out, with beta 1 accumulating onto what out holds (one rounding of the fp32 sum
// to 16 bits; the shared expert, which has no biases). `shared`: the shared expert's profile names.
void CudaGPT::expert_forward(bool shared, int64_t n, int64_t F, const bf16* x, int64_t w1, int64_t w2, bf16* fc1_out, bf16* act, bf16* out,
                             float beta, cudaStream_t st, int64_t b1, int64_t b2, const ExpertFp8* f8, int64_t real, bool act_apart) {
  auto& lt = cuda::GemmLt::instance();
  const int64_t h = D_.h, F1 = D_.swiglu ? 2 * F : F;
  const char* fc1_name = shared ? "fwd.moe.shared.gemm.fc1" : "fwd.moe.gemm.fc1";
  const char* act_name = shared ? "fwd.moe.shared.activation" : "fwd.moe.activation";
  const char* fc2_name = shared ? "fwd.moe.shared.gemm.fc2" : "fwd.moe.gemm.fc2";
  if (f8) {  // (GELU apart from the FP8 GEMM, as the dense FP8 layers run it)
    expert_linear_fp8(*f8, 0, fc1_name, n, h, F1, x, w1, w(b1), 0.0f, fc1_out, st);
    // (delayed scaling: SwiGLU writes fc2's FP8 input itself, the padding rows' zero as fc1's output rows are)
    const bool act_cast = expert_swiglu_fp8(*f8, act_name, n, F, fc1_out, st);
    if (!act_cast && act == nullptr) {
      throw std::logic_error("CUDA model: SwiGLU's fused FP8 cast does not take an expert's " + std::to_string(n) + " x " + std::to_string(F) +
                             " activation, and its 16-bit output has no buffer");
    }
    if (!act_cast) expert_activation(act_name, n, F, fc1_out, act, st);
    // The padding rows' activations: act(b1) with biases, zero without; zero either way, so that fc2's amax is the rows'.
    if (b1 >= 0 && real < n) MT_CUDA_CHECK(cudaMemsetAsync(act + real * F, 0, static_cast<size_t>((n - real) * F) * 2, st));
    expert_linear_fp8(*f8, 1, fc2_name, n, F, h, act, w2, w(b2), beta, out, st, act_cast);
    return;
  }
  if (D_.swiglu || D_.squared_relu || D_.gelu_erf || act_apart) {  // (act_apart: GELU too, by the kernel a recompute runs again)
    MT_PROF_ON(st, fc1_name, lt.gemm_ex(false, true, n, F1, h, 1.0f, x, h, w(w1), h, 0.0f, fc1_out, F1, ab_, ab_, w(b1), st, {}, !shared));
    expert_activation(act_name, n, F, fc1_out, act, st);
  } else {
    MT_PROF_ON(st, fc1_name,
               lt.gemm_ex(false, true, n, F, h, 1.0f, x, h, w(w1), h, 0.0f, act, F, ab_, ab_, w(b1), st, {cuda::GemmEpilogue::kGeluAux, fc1_out, F},
                          !shared));
  }
  MT_PROF_ON(st, fc2_name, lt.gemm_ex(false, true, n, h, F, 1.0f, act, F, w(w2), F, beta, out, h, ab_, ab_, w(b2), st, {}, !shared));
}

// Its backward from dout [n, h]: dact (SwiGLU's and squared ReLU's) and dfc1 as scratch, the input gradient into din
// (beta 1: accumulated onto it), and both weight gradients.
void CudaGPT::expert_backward(bool shared, int64_t n, int64_t F, const bf16* dout, const bf16* x, int64_t w1, int64_t w2, const bf16* fc1_out,
                              const bf16* act, bf16* dact, bf16* dfc1, bf16* din, float din_beta, cudaStream_t st, const ExpertFp8* f8) {
  auto& lt = cuda::GemmLt::instance();
  const int64_t h = D_.h, F1 = D_.swiglu ? 2 * F : F;
  const char* dgrad_name = shared ? "bwd.moe.shared.gemm.fc2_dgrad" : "bwd.moe.gemm.fc2_dgrad";
  if (f8) {  // (the weight gradients from the FP8 x^T the forward kept: x and act are not read)
    const char* act_name = shared ? "bwd.moe.shared.activation" : "bwd.moe.activation";
    expert_linear_fp8_backward(*f8, 1, dgrad_name, shared ? "bwd.moe.shared.gemm.fc2_wgrad" : "bwd.moe.gemm.fc2_wgrad", n, F, h, dout, w2, 0.0f, dact,
                               st);
    // (delayed scaling: SwiGLU's backward writes fc1's FP8 output gradient itself; nothing reads the 16-bit one without biases)
    const bool dfc1_cast = expert_swiglu_backward_fp8(*f8, act_name, n, F, dact, fc1_out, st);
    if (!dfc1_cast) expert_activation_backward(act_name, n, F, dact, fc1_out, dfc1, st);
    expert_linear_fp8_backward(*f8, 0, shared ? "bwd.moe.shared.gemm.fc1_dgrad" : "bwd.moe.gemm.fc1_dgrad",
                               shared ? "bwd.moe.shared.gemm.fc1_wgrad" : "bwd.moe.gemm.fc1_wgrad", n, h, F1, dfc1, w1, din_beta, din, st, dfc1_cast);
    return;
  }
  if (D_.swiglu || D_.squared_relu || D_.gelu_erf) {
    MT_PROF_ON(st, dgrad_name, lt.gemm_ex(false, false, n, F, h, 1.0f, dout, h, w(w2), F, 0.0f, dact, F, ab_, ab_, nullptr, st, {}, !shared));
  } else {  // the GELU backward (tanh form) in the epilogue, straight to d(fc1 output)
    MT_PROF_ON(st, dgrad_name,
               lt.gemm_ex(false, false, n, F, h, 1.0f, dout, h, w(w2), F, 0.0f, dfc1, F, ab_, ab_, nullptr, st,
                          {cuda::GemmEpilogue::kDGelu, const_cast<bf16*>(fc1_out), F}, !shared));
  }
  wgrad_with_bias(st, shared ? "bwd.moe.shared.gemm.fc2_wgrad" : "bwd.moe.gemm.fc2_wgrad", h, n, dout, act, F, w2, -1, !shared);
  const char* act_name = shared ? "bwd.moe.shared.activation" : "bwd.moe.activation";
  if (D_.swiglu || D_.squared_relu || D_.gelu_erf) expert_activation_backward(act_name, n, F, dact, fc1_out, dfc1, st);
  MT_PROF_ON(st, shared ? "bwd.moe.shared.gemm.fc1_dgrad" : "bwd.moe.gemm.fc1_dgrad",
             lt.gemm_ex(false, false, n, h, F1, 1.0f, dfc1, F1, w(w1), h, din_beta, din, h, ab_, ab_, nullptr, st, {}, !shared));
  wgrad_with_bias(st, shared ? "bwd.moe.shared.gemm.fc1_wgrad" : "bwd.moe.gemm.fc1_wgrad", F1, n, dfc1, x, h, w1, -1, !shared);
}

void CudaGPT::moe_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, const bf16* dy) {
  const ModelDims& D = D_;
  const LayerW& lw = layers_[static_cast<size_t>(l)];
  Scratch& s = *s_;
  const int64_t T = mb.B * mb.S, h = D.h, Fm = F_moe_, F1m = D.swiglu ? 2 * F_moe_ : F_moe_;
  const cuda::MoeRouting rt = moe_routing(mb);
  // (--moe-apply-probs-on-input: unweighted, and the weights' gradient comes from the experts' input gradients below)
  MT_PROF("bwd.moe.combine", cuda::moe_combine_backward(s.ex_dout, s.dweight, dy, r.ex_out, r.row, moe_probs_on_input_ ? moe_ones_ : r.route_weight, rt,
                                                        stream_, dt_));
  // (padding rows: weight 0, so no output gradient; their input gradients are read by no token)
  if (r.pads > 0) MT_PROF("bwd.moe.combine", cuda::moe_pad_rows(s.ex_dout, nullptr, r.pad_map, r.pads, h, stream_, dt_));
  // This rank's experts' rows and buffers (under expert parallelism the output gradients travel to them first, and with
  // expert-TP's gather they are gathered as the rows were).
  bf16 *dout = s.ex_dout, *rows = r.ex_rows, *fc1 = r.ex_fc1, *act = r.ex_act, *dact = s.ex_dact, *dfc1 = s.ex_dfc1, *din = s.ex_din;
  bf16* local_din = s.ex_din;  // (this rank's rows' input gradients, before the way back over EP)
  if (moe_rows_travel()) {
    const auto idle = [this] { host_wait("the MoE layer's expert buffers"); };
    int64_t R = 0;  // (the experts' rows: gathered over expert-TP where it gathers)
    for (int32_t n : r.per_expert) R += n;
    const int64_t local = moe_etp_gathers_ ? r.local_rows : R;  // (this rank's own, or what EP brought)
    if (D.ep > 1) {
      dout = s.ep_dout.need<bf16>(static_cast<size_t>(std::max<int64_t>(local, 1) * h) * 2, idle);
      local_din = s.ep_din.need<bf16>(static_cast<size_t>(std::max<int64_t>(local, 1) * h) * 2, idle);
      // (FP8 models: the owner layout's padding rows zero before they travel; FP8 layers: the experts' FP8 scratch for
      // what arrives)
      if (moe_row_align_ > 1) zero_expert_padding(s.ex_dout, h, r.owner_per_expert, stream_);
      if (fp8_layer(l)) expert_fp8_rows(r, R, false);
      ep_to_experts(r, s.ex_dout, dout, "bwd.moe.ep.dispatch");
    }
    din = local_din;
    if (moe_etp_gathers_) {
      bf16* gathered = s.etp_dout.need<bf16>(static_cast<size_t>(std::max<int64_t>(R, 1) * h) * 2, idle);
      etp_to_experts(r, dout, gathered, "bwd.moe.etp.gather");
      dout = gathered;
      din = s.etp_din.need<bf16>(static_cast<size_t>(std::max<int64_t>(R, 1) * h) * 2, idle);
    }
    dact = s.ep_dact.need<bf16>(static_cast<size_t>(R * Fm) * 2, idle);
    dfc1 = s.ep_dfc1.need<bf16>(static_cast<size_t>(R * F1m) * 2, idle);
    rows = moe_etp_gathers_ ? r.etp_rows.get<bf16>() : r.ep_rows.get<bf16>();
    fc1 = r.ep_fc1.get<bf16>();
    act = expert_act_shared(l) ? s.ep_act_shared.need<bf16>(static_cast<size_t>(R * Fm) * 2, idle) : r.ep_act.get<bf16>();
  }
  const bool f8 = fp8_layer(l), recompute_act = expert_act_recomputed(l);
  if (f8) zero_expert_padding(dout, h, r.per_expert, stream_);
  fork_experts();
  int64_t off = 0, busy = 0, blocks = 0;
  for (size_t e = 0; e < r.per_expert.size(); ++e) {
    const int64_t n = r.per_expert[e], rows_e = f8 ? align_rows(n) : n;
    if (n > 0) {
      const ExpertFp8 x8 = f8 ? expert_fp8(l, r, static_cast<int64_t>(e), off, blocks) : ExpertFp8{};
      bf16* act_e = act ? act + off * Fm : nullptr;  // (none under FP8 delayed scaling's fused SwiGLU: the FP8 backward reads none)
      // (--recompute-modules moe_act: the activation again, by the forward's kernel, from the fc1 output kept)
      if (recompute_act) expert_activation("bwd.moe.recompute.activation", n, Fm, fc1 + off * F1m, act_e, expert_stream(busy));
      expert_backward(false, rows_e, Fm, dout + off * h, rows + off * h, lw.expert_fc1[e], lw.expert_fc2[e], fc1 + off * F1m, act_e, dact + off * Fm,
                      dfc1 + off * F1m, din + off * h, 0.0f, expert_stream(busy++), f8 ? &x8 : nullptr);
    }
    off += align_rows(n);
    blocks += (rows_e + cuda::kFp8BlockSize - 1) / cuda::kFp8BlockSize;
  }
  join_experts();
  if (final_backward_) zero_unwritten_experts(lw);
  // The experts' bias gradients (--add-bias-linear): the column sums of each expert's rows of the output gradient and
  // of d(fc1 output), on the layer's stream (the kernel's scratch is not the expert streams' to share).
  if (!lw.expert_fc1_b.empty() && lw.expert_fc1_b.front() >= 0) {
    off = 0;
    for (size_t e = 0; e < r.per_expert.size(); ++e) {
      const int64_t n = r.per_expert[e];
      if (n > 0) {
        MT_PROF("bwd.moe.bias_grad", cuda::bias_grad_bf16(g(lw.expert_fc2_b[e]), dout + off * h, n, h, stream_, dt_));
        MT_PROF("bwd.moe.bias_grad", cuda::bias_grad_bf16(g(lw.expert_fc1_b[e]), dfc1 + off * F1m, n, F1m, stream_, dt_));
      }
      off += align_rows(n);
    }
  }
  if (moe_etp_gathers_) etp_to_local(r, din, local_din, "bwd.moe.etp.scatter");
  if (D.ep > 1) ep_to_owners(r, local_din, s.ex_din, "bwd.moe.ep.combine");
  if (moe_probs_on_input_) {
    // Each choice's weight gradient: <its row's input gradient, the token's row> (the combine-backward kernel's dot, its
    // rows written into the no longer needed output-gradient rows); the input gradient then takes the weights.
    MT_PROF("bwd.moe.combine", cuda::moe_combine_backward(s.ex_dout, s.dweight, r.xn2, s.ex_din, r.row, moe_ones_, rt, stream_, dt_));
  }
  // The router: through the weights, plus the aux and z losses' gradients at the lm loss's scale. Under TP every rank
  // routes the group's gathered rows alike, and its routing weights' gradient is a partial sum (its experts' shards'
  // outputs), as the router's weight and input gradients are; the TP sums complete them (the router weight is
  // TP-replicated under SP, its gradient summed over TP; the input gradient's rows are reduced as the dense MLP's), so
  // the aux and z losses' own terms enter each rank's share at 1 / TP. Under fp16 they take the loss scale too (the
  // routing weights' gradient has it already, from the lm loss's).
  const float aux_scale = mb.aux_grad_scale / static_cast<float>(D.tp);
  MT_PROF("bwd.moe.router", cuda::moe_router_backward(s.dlogits, r.logits, r.top, s.dweight, moe_aux_ ? r.aux_dscale : nullptr, moe_z_coeff_,
                                                      aux_scale, rt, stream_, loss_scale_));
  // (--moe-input-jitter-eps: the router's input gradient times the noise, its weight gradient from the noisy input,
  // drawn again here: the forward's copy is scratch)
  const cuda::MoeJitter jitter = moe_jitter(l, mb);
  const bool jittered = moe_jitter_eps_ > 0;
  MT_PROF("bwd.moe.input", cuda::moe_input_backward(s.dxn, s.ex_din, r.row, s.dlogits, w(lw.router_w), rt, stream_, dt_,
                                                    moe_probs_on_input_ ? r.route_weight : nullptr, jittered ? &jitter : nullptr));
  if (jittered) MT_PROF("bwd.moe.router", cuda::moe_jitter_router_input(s.router_input, r.xn2, rt, jitter, stream_, dt_));
  MT_PROF("bwd.moe.router_wgrad", cuda::moe_router_wgrad(g(lw.router_w), s.wgrad_parts, s.dlogits, jittered ? s.router_input : r.xn2, rt, stream_, dt_));
  if (lw.router_b >= 0) MT_PROF("bwd.moe.router_wgrad", cuda::moe_router_bias_grad(g(lw.router_b), s.dlogits, rt, stream_));
  // The shared expert, its input gradient added onto the routed experts' and the router's.
  if (lw.shared_fc1_w >= 0) {
    const ExpertFp8 x8 = f8 ? expert_fp8(l, r, experts_, 0, 0) : ExpertFp8{};
    const bf16* shared_dy = dy;
    if (lw.shared_gate_w >= 0) {
      // The gate: the shared expert's output gradient times it; its logit's gradient (under TP from this rank's partial
      // output, so the weight's and the input's gradients are partial sums as the router's are) into the input gradient
      // and the weight (a one-expert router weight gradient).
      MT_PROF("bwd.moe.shared.gate", cuda::moe_shared_gate_backward(s.sh_dgated, s.sh_dlogit, s.dxn, dy, r.sh_out, r.sh_gate, w(lw.shared_gate_w), T, h,
                                                                     stream_, dt_));
      MT_PROF("bwd.moe.shared.gate", cuda::moe_router_wgrad(g(lw.shared_gate_w), s.wgrad_parts, s.sh_dlogit, r.xn2, cuda::MoeRouting{T, 1, 1, h},
                                                             stream_, dt_));
      shared_dy = s.sh_dgated;
    }
    expert_backward(true, T, F_shared_, shared_dy, r.xn2, lw.shared_fc1_w, lw.shared_fc2_w, r.sh_fc1, r.sh_act, s.sh_dact, s.sh_dfc1, s.dxn, 1.0f, stream_,
                    f8 ? &x8 : nullptr);
  }
}

}  // namespace mt
