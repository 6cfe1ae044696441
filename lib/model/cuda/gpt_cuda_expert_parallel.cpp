// gpt_cuda_expert_parallel.cpp: expert parallelism on the CUDA engine (the alltoall dispatcher, as the CPU engine's
// model/cpu/moe_dispatch.cpp): each EP rank routes its own tokens over every expert, its choices' rows (in owner order:
// expert-major over all experts, so each destination rank's rows are one block) go to the ranks holding the experts by
// an all-to-all with per-rank counts, each rank's experts compute what arrives, and a second all-to-all takes the
// outputs back for the weighted combine. The backward sends the output gradients the same way and the input gradients
// back. The counts per expert travel first (an all-to-all of E integers), and the host reads them: they size the GEMMs.
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/cuda/gpt_cuda_state.h"
#include "model/regroup_rows.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {
namespace {

// Blocks of rows (a, b), a the outer index and block (a, b) counts[a][b] rows of row_bytes, copied from a-outer order in
// `from` into b-outer order in `to` (inverse: from b-outer back to a-outer).
void regroup_rows(void* to, const void* from, const std::vector<std::vector<int64_t>>& counts, size_t row_bytes, bool inverse, cudaStream_t st) {
  for (const RowBlockMove& m : regroup_moves(counts, inverse)) {
    MT_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(to) + static_cast<size_t>(m.to) * row_bytes,
                                  static_cast<const char*>(from) + static_cast<size_t>(m.from) * row_bytes, static_cast<size_t>(m.rows) * row_bytes,
                                  cudaMemcpyDeviceToDevice, st));
  }
}

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

void CudaGPT::host_wait(const char* op) {
  if (StreamCollectives* group = ep_ != nullptr ? ep_ : etp_) group->host_wait_on(stream_, op);
  else MT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaGPT::set_expert_parallel(StreamCollectives* ep) {
  if (ep == nullptr || ep->group_size() != D_.ep || ep->group_rank() != D_.ep_rank) {
    throw std::logic_error("CudaGPT::set_expert_parallel: the group is not this layout's expert-parallel group (EP " + std::to_string(D_.ep) +
                           ", rank " + std::to_string(D_.ep_rank) + ")");
  }
  ep_ = ep;
}

int64_t CudaGPT::ep_dispatch(Record& r) {
  if (ep_ == nullptr) throw std::logic_error("CudaGPT: expert parallelism without its group (set_expert_parallel before the first step)");
  Scratch& s = *s_;
  const int64_t E = experts_, n = D_.ep, El = D_.experts_local, h = D_.h;
  // The rows per expert this rank sends (r.per_expert: every expert's, in owner order) and those its experts receive.
  // FP8: each expert's block padded to 16 rows (zero rows, as the owner layout leaves them), so that on the receiving
  // rank every source's rows of an expert, and so the expert's, stay 16-aligned.
  int32_t* host = s.counts_host;
  r.owner_per_expert = r.per_expert;
  for (size_t e = 0; e < r.per_expert.size(); ++e) host[e] = static_cast<int32_t>(align_rows(r.per_expert[e]));
  MT_PROF("fwd.moe.ep.counts", {
    MT_CUDA_CHECK(cudaMemcpyAsync(s.ep_counts, host, static_cast<size_t>(E) * 4, cudaMemcpyHostToDevice, stream_));
    ep_->all_to_all_on(s.ep_counts, s.ep_counts + E, El, WireType::kF32, stream_);  // (4-byte integers, moved as they are)
    MT_CUDA_CHECK(cudaMemcpyAsync(host + E, s.ep_counts + E, static_cast<size_t>(E) * 4, cudaMemcpyDeviceToHost, stream_));
    host_wait("the MoE layer's expert counts (EP all-to-all)");
  });
  r.ep_from.assign(static_cast<size_t>(n), std::vector<int64_t>(static_cast<size_t>(El)));
  r.ep_send.assign(static_cast<size_t>(n), 0);
  r.ep_recv.assign(static_cast<size_t>(n), 0);
  std::vector<int32_t> local(static_cast<size_t>(El), 0);
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t j = 0; j < El; ++j) {
      const int32_t got = host[E + q * El + j];
      if (got < 0) throw std::runtime_error("expert parallelism: EP rank " + std::to_string(q) + " sent a negative row count");
      r.ep_from[static_cast<size_t>(q)][static_cast<size_t>(j)] = got;
      local[static_cast<size_t>(j)] += got;
      r.ep_send[static_cast<size_t>(q)] += static_cast<int64_t>(host[q * El + j]) * h;
      r.ep_recv[static_cast<size_t>(q)] += static_cast<int64_t>(got) * h;
    }
  }
  r.per_expert = local;
  const int64_t rows = sum_of(r.ep_recv) / h;
  bf16* received = r.ep_rows.need<bf16>(static_cast<size_t>(rows * h) * 2, [this] { host_wait("the EP rows' buffer"); });
  ep_to_experts(r, r.ex_rows, received, "fwd.moe.ep.dispatch");
  return rows;
}

void CudaGPT::ep_to_experts(const Record& r, const bf16* owner_rows, bf16* expert_rows, const char* name) {
  Scratch& s = *s_;
  const int64_t h = D_.h, rows = sum_of(r.ep_recv) / h;
  bf16* transit = s.ep_transit.need<bf16>(static_cast<size_t>(rows * h) * 2, [this] { host_wait("the EP transit buffer"); });
  MT_PROF(name, {
    ep_->all_to_all_v_on(owner_rows, r.ep_send, transit, r.ep_recv, wire_, stream_);
    regroup_rows(expert_rows, transit, r.ep_from, static_cast<size_t>(h) * 2, false, stream_);
  });
}

void CudaGPT::ep_to_owners(const Record& r, const bf16* expert_rows, bf16* owner_rows, const char* name) {
  Scratch& s = *s_;
  const int64_t h = D_.h, rows = sum_of(r.ep_recv) / h;
  bf16* transit = s.ep_transit.need<bf16>(static_cast<size_t>(rows * h) * 2, [this] { host_wait("the EP transit buffer"); });
  MT_PROF(name, {
    regroup_rows(transit, expert_rows, r.ep_from, static_cast<size_t>(h) * 2, true, stream_);
    ep_->all_to_all_v_on(transit, r.ep_recv, owner_rows, r.ep_send, wire_, stream_);
  });
}

}  // namespace mt
