// gpt_cuda_streams.cpp: what the CUDA model's passes share around their kernels: the TP rows' combines and gathers
// (row-parallel sums, SP's scatters and gathers, K/V-replica heads, the replicated gradients' sums, settings every TP
// rank must share) and the side streams (the weight gradients', the experts').
#include "model/cuda/gpt_cuda_state.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/gemm_lt.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

// The TP ranks must issue the same collectives: a setting that follows each rank's environment must agree.
void CudaGPT::agree_over_tp(bool mine, const char* env) {
  float* agree = static_cast<float*>(alloc(4));
  const float one = mine ? 1.0f : 0.0f;
  MT_CUDA_CHECK(cudaMemcpyAsync(agree, &one, 4, cudaMemcpyHostToDevice, stream_));
  tp_->all_reduce_on(agree, 1, WireType::kF32, ReduceOp::kSum, stream_);
  float sum = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&sum, agree, 4, cudaMemcpyDeviceToHost, stream_));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (sum != 0.0f && sum != static_cast<float>(tp_size_)) {
    throw std::runtime_error(std::string("the tensor-parallel ranks disagree on ") + env + ": set it the same for every rank (mpirun -x)");
  }
}

const bf16* CudaGPT::combine_rows(bf16* full, bf16* local, int64_t T) {
  if (!tp_) return full;
  if (sp_) {
    MT_PROF("tp.reduce_scatter", tp_->reduce_scatter_on(full, local, T / tp_size_ * D_.h, wire_, stream_));
    return local;
  }
  MT_PROF("tp.all_reduce", tp_->all_reduce_on(full, T * D_.h, wire_, ReduceOp::kSum, stream_));
  return full;
}

// K/V replication: this rank's nh_local query heads [T, nh_local, d] and all its group's [T, qh_local, d].
// Forward: own = its slice of group; backward: group = own in its slice, zeros elsewhere.
void CudaGPT::copy_own_heads(bf16* own, bf16* group, int64_t T, bool to_group) {
  const size_t row = static_cast<size_t>(D_.nh_local * D_.d) * 2, all = static_cast<size_t>(D_.qh_local * D_.d) * 2;
  char* slice = reinterpret_cast<char*>(group) + static_cast<size_t>(D_.tp_rank % D_.kv_rep) * row;
  const auto rows = static_cast<size_t>(T);
  if (to_group) {
    MT_CUDA_CHECK(cudaMemsetAsync(group, 0, all * rows, stream_));
    MT_CUDA_CHECK(cudaMemcpy2DAsync(slice, all, own, row, row, rows, cudaMemcpyDeviceToDevice, stream_));
  } else {
    MT_CUDA_CHECK(cudaMemcpy2DAsync(own, row, slice, all, row, rows, cudaMemcpyDeviceToDevice, stream_));
  }
}

// A weight gradient dW[n, h] += dy[T, n]^T x[T, h] on stream ws and, with a bias, its gradient from the GEMM's
// epilogue (the sum over tokens of dy, from the same read) added to the bias's. Nothing here takes
// temporaries from the caching allocator, which assumes the compute stream.
void CudaGPT::wgrad_with_bias(cudaStream_t ws, const char* name, int64_t n, int64_t T, const bf16* dy, const bf16* x, int64_t h, int64_t w_off,
                              int64_t b_off, bool varying) {
  auto& lt = cuda::GemmLt::instance();
  const float beta = wgrad_beta(w_off);
  if (b_off < 0) {
    MT_PROF_ON(ws, name, lt.gemm_ex(true, false, n, h, T, 1.0f, dy, n, x, h, beta, g(w_off), h, ab_, CUDA_R_32F, nullptr, ws, {}, varying));
    return;
  }
  float* tmp = ws == stream_ ? s_->bgrad : s_->bgrad + bgrad_len_;  // one per stream: the two may run at once
  MT_PROF_ON(ws, name, lt.gemm_ex(true, false, n, h, T, 1.0f, dy, n, x, h, beta, g(w_off), h, ab_, CUDA_R_32F, nullptr, ws,
                                  {cuda::GemmEpilogue::kBiasGrad, tmp, 0}, varying));
  MT_PROF_ON(ws, "bwd.bias_grad", cuda::add_f32(g(b_off), tmp, n, ws));
}

cudaStream_t CudaGPT::fork_wgrad() {
  if (!wgrad_stream_) return stream_;
  MT_CUDA_CHECK(cudaEventRecord(fork_ev_, stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(wgrad_stream_, fork_ev_, 0));
  return wgrad_stream_;
}

void CudaGPT::join_wgrad() {
  if (!wgrad_stream_) return;
  MT_CUDA_CHECK(cudaEventRecord(join_ev_, wgrad_stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, join_ev_, 0));
}

void CudaGPT::fork_experts() {
  if (expert_streams_.empty()) return;
  MT_CUDA_CHECK(cudaEventRecord(experts_fork_ev_, stream_));
  for (cudaStream_t st : expert_streams_) MT_CUDA_CHECK(cudaStreamWaitEvent(st, experts_fork_ev_, 0));
}

cudaStream_t CudaGPT::expert_stream(int64_t i) const {
  return expert_streams_.empty() ? stream_ : expert_streams_[static_cast<size_t>(i) % expert_streams_.size()];
}

void CudaGPT::join_experts() {
  for (size_t i = 0; i < expert_streams_.size(); ++i) {
    MT_CUDA_CHECK(cudaEventRecord(expert_done_ev_[i], expert_streams_[i]));
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, expert_done_ev_[i], 0));
  }
}

bf16* CudaGPT::gather_rows(bf16* local, bf16* full, int64_t T) {
  if (!sp_) return local;
  MT_PROF("tp.all_gather", tp_->all_gather_on(local, full, T / tp_size_ * D_.h, wire_, stream_));
  return full;
}

bf16* CudaGPT::norm_out(bf16* full) const { return sp_ ? s_->xn_l : full; }

void CudaGPT::sum_replicated_grads(const std::vector<std::pair<int64_t, int64_t>>& params, cudaStream_t st) {
  if (!sp_ || !final_backward_ || params.empty()) return;
  tp_->group_start();
  for (const auto& [off, n] : params) tp_->all_reduce_on(g(off), n, WireType::kF32, ReduceOp::kSum, st);
  MT_PROF_ON(st, "tp.replicated_grads", tp_->group_end());
}

}  // namespace mt
