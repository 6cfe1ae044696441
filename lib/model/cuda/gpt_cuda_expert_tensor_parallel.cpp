// gpt_cuda_expert_tensor_parallel.cpp: expert tensor parallelism other than TP on the CUDA engine (Megatron's MoE
// parallel folding, as the CPU engine's model/cpu/moe_dispatch.cpp does it): each rank's experts are shards (1 /
// expert-TP of each expert's MLP) that compute the rows of every rank of the expert-TP group, so the rows of the local
// experts (this rank's own, or what EP's all-to-all brought) are gathered over that group before the experts, and the
// partial outputs summed back to their rank after; the backward gathers the output gradients and sums the input
// gradients back the same way. The ranks' counts differ: each rank's rows travel in a block of the group's largest
// count (all-gather and reduce-scatter of equal blocks; the rows past a rank's count are never read).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/cuda/gpt_cuda_state.h"
#include "model/regroup_rows.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {
namespace {

// The copies between the rank-major blocks (rank q's rows at q x block, expert-major inside) and the expert-major order
// (expert j's rows from rank 0, then rank 1, ...). to_experts: blocks -> expert-major, else back.
void move_blocks(bf16* to, const bf16* from, const std::vector<std::vector<int64_t>>& counts, int64_t block, int64_t h, bool to_experts,
                 cudaStream_t st) {
  for (const RowBlockMove& m : padded_block_moves(counts, block, to_experts)) {
    MT_CUDA_CHECK(cudaMemcpyAsync(to + m.to * h, from + m.from * h, static_cast<size_t>(m.rows * h) * sizeof(bf16), cudaMemcpyDeviceToDevice, st));
  }
}

}  // namespace

void CudaGPT::set_expert_tensor_parallel(StreamCollectives* etp) {
  if (etp == nullptr || etp->group_size() != D_.etp || etp->group_rank() != D_.etp_rank) {
    throw std::logic_error("CudaGPT::set_expert_tensor_parallel: the group is not this layout's expert-tensor-parallel group (expert-TP " +
                           std::to_string(D_.etp) + ", rank " + std::to_string(D_.etp_rank) + ")");
  }
  etp_ = etp;
}

int64_t CudaGPT::etp_gather(Record& r, const bf16* local, int64_t local_rows) {
  if (etp_ == nullptr) throw std::logic_error("CudaGPT: expert-TP without its group (set_expert_tensor_parallel before the first step)");
  Scratch& s = *s_;
  const int64_t n = D_.etp, El = D_.experts_local, h = D_.h;
  if (static_cast<int64_t>(r.per_expert.size()) != El) throw std::logic_error("CudaGPT: expert-TP's gather without this rank's counts per local expert");
  int32_t* host = s.etp_counts_host;
  std::copy(r.per_expert.begin(), r.per_expert.end(), host);
  MT_PROF("fwd.moe.etp.counts", {
    MT_CUDA_CHECK(cudaMemcpyAsync(s.etp_counts, host, static_cast<size_t>(El) * 4, cudaMemcpyHostToDevice, stream_));
    etp_->all_gather_on(s.etp_counts, s.etp_counts + El, El, WireType::kF32, stream_);  // (4-byte integers, moved as they are)
    MT_CUDA_CHECK(cudaMemcpyAsync(host + El, s.etp_counts + El, static_cast<size_t>(n * El) * 4, cudaMemcpyDeviceToHost, stream_));
    etp_->host_wait_on(stream_, "the MoE layer's expert counts (expert-TP all-gather)");
  });
  r.etp_counts.assign(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(El)));
  r.local_rows = local_rows;
  r.etp_block = 0;
  std::vector<int32_t> gathered(static_cast<size_t>(El), 0);
  int64_t rows = 0;
  for (int64_t q = 0; q < n; ++q) {
    int64_t total = 0;
    for (int64_t j = 0; j < El; ++j) {
      const int32_t c = host[El + q * El + j];
      if (c < 0) throw std::runtime_error("expert tensor parallelism: expert-TP rank " + std::to_string(q) + " sent a negative row count");
      r.etp_counts[static_cast<size_t>(q)][static_cast<size_t>(j)] = c;
      gathered[static_cast<size_t>(j)] += c;
      total += c;
    }
    if (q == D_.etp_rank && total != local_rows) throw std::logic_error("CudaGPT: expert-TP's gathered counts are not this rank's rows");
    r.etp_block = std::max(r.etp_block, total);
    rows += total;
  }
  r.per_expert = gathered;
  bf16* into = r.etp_rows.need<bf16>(static_cast<size_t>(std::max<int64_t>(rows, 1) * h) * 2, [this] { etp_->host_wait_on(stream_, "the expert-TP rows' buffer"); });
  etp_to_experts(r, local, into, "fwd.moe.etp.gather");
  return rows;
}

// The transit buffer of r's blocks: expert-TP + 1 blocks of r.etp_block rows (at least 1), the ranks' blocks then this
// rank's own (its rows staged for the gather, or its summed rows after the reduce-scatter).
bf16* CudaGPT::etp_transit(const Record& r) {
  const int64_t rows = (D_.etp + 1) * std::max<int64_t>(r.etp_block, 1);
  return s_->etp_transit.need<bf16>(static_cast<size_t>(rows * D_.h) * 2, [this] { etp_->host_wait_on(stream_, "the expert-TP transit buffer"); });
}

void CudaGPT::etp_to_experts(const Record& r, const bf16* local, bf16* gathered, const char* name) {
  const int64_t n = D_.etp, h = D_.h, block = std::max<int64_t>(r.etp_block, 1);
  bf16* transit = etp_transit(r);
  bf16* stage = transit + n * block * h;
  MT_PROF(name, {
    if (r.local_rows > 0) {
      MT_CUDA_CHECK(cudaMemcpyAsync(stage, local, static_cast<size_t>(r.local_rows * h) * 2, cudaMemcpyDeviceToDevice, stream_));
    }
    etp_->all_gather_on(stage, transit, block * h, wire_, stream_);
    move_blocks(gathered, transit, r.etp_counts, block, h, true, stream_);
  });
}

void CudaGPT::etp_to_local(const Record& r, const bf16* gathered, bf16* local, const char* name) {
  const int64_t n = D_.etp, h = D_.h, block = std::max<int64_t>(r.etp_block, 1);
  bf16* transit = etp_transit(r);
  bf16* summed = transit + n * block * h;
  MT_PROF(name, {
    // (the rows past a rank's count in its block are summed too, and never read)
    move_blocks(transit, gathered, r.etp_counts, block, h, false, stream_);
    etp_->reduce_scatter_on(transit, summed, block * h, wire_, stream_);
    if (r.local_rows > 0) {
      MT_CUDA_CHECK(cudaMemcpyAsync(local, summed, static_cast<size_t>(r.local_rows * h) * 2, cudaMemcpyDeviceToDevice, stream_));
    }
  });
}

}  // namespace mt
