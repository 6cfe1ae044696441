// stream_collectives.h: collectives queued on the caller's CUDA stream, ordered with its compute and with
// no host wait: what tensor parallelism calls inside a training step (the partial sums of row-parallel
// linears, sequence-parallel gathers and scatters, the vocab-parallel loss). NcclCommunicator implements
// it; the model sees only this interface, so it builds without NCCL headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace mt {

enum class WireType { kF32, kBF16, kF16 };

class StreamCollectives {
 public:
  virtual ~StreamCollectives() = default;
  virtual int group_rank() const = 0;
  virtual int group_size() const = 0;
  virtual void all_reduce_on(void* data, int64_t n, WireType type, ReduceOp op, cudaStream_t s) = 0;
  // recv[n_per_rank] = sum over ranks of send[rank * n_per_rank ..).
  virtual void reduce_scatter_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) = 0;
  // recv[r * n_per_rank ..) = send of rank r.
  virtual void all_gather_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) = 0;
  // recv[r * n_per_rank ..) = rank r's send[group_rank() * n_per_rank ..). On symmetric windows under NCCL's
  // zero-CTA policy the copy engines move it: no SM taken from the compute beside it.
  virtual void all_to_all_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) = 0;
  // recv_counts[r] elements from rank r into recv and send_counts[r] of send to rank r, each back to back in
  // rank order (MPI_Alltoallv's contract; the token dispatch of expert parallelism).
  virtual void all_to_all_v_on(const void* send, const std::vector<int64_t>& send_counts, void* recv, const std::vector<int64_t>& recv_counts,
                               WireType type, cudaStream_t s) = 0;
  // The transfers of one batch as one launch on s (the activations and gradients at pipeline stage
  // boundaries); peers are group ranks. Between two ranks the transfers in one direction meet in order.
  struct Transfer {
    bool send = true;
    void* data = nullptr;
    int64_t n = 0;
    int peer = 0;
  };
  virtual void send_recv_on(const std::vector<Transfer>& batch, WireType type, cudaStream_t s) = 0;
  // Collectives between group_start and group_end go out as one launch.
  virtual void group_start() = 0;
  virtual void group_end() = 0;
  // `bytes` of device memory registered with every rank of this group as a symmetric window, so that NCCL's
  // symmetric-memory kernels (fewer SMs taken from the compute beside them) run the collectives on it;
  // owned by the group. nullptr where there are none (then allocate as usual). Collective: every rank calls
  // it in the same order with the same size, and passes the same offsets into it to a collective.
  virtual void* alloc_window(size_t bytes) {
    (void)bytes;
    return nullptr;
  }
  // The host waits for the work queued so far on s, which may include this group's collectives (e.g. before reading
  // counts that an all-to-all brought): NCCL's watches for errors and --distributed-timeout-seconds, so a dead peer
  // ends the job naming `op` instead of hanging it.
  virtual void host_wait_on(cudaStream_t s, const char* op) {
    (void)op;
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error(std::string("a CUDA stream failed before ") + op);
  }
  // The ranks of this group with the same color, ordered by key (collective: every rank calls it).
  virtual std::shared_ptr<StreamCollectives> stream_sub_group(int color, int key, const std::string& name) = 0;
};

}  // namespace mt
