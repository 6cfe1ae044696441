// nccl_communicator.h: Communicator over NCCL for device (GPU) buffers, on its own CUDA stream.
// Every call is checked with file:line; a collective that does not finish within the timeout (another
// rank died) aborts the communicator and throws, so no rank hangs forever. The unique id travels over
// MPI (mpirun / srun launches) or the TCP rendezvous at MASTER_ADDR:MASTER_PORT (torchrun-style).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/cuda/stream_collectives.h"
#include "parallel/launcher.h"
#include "parallel/rank_layout.h"

namespace mt {

class NcclCommunicator final : public Communicator, public StreamCollectives {
 public:
  NcclCommunicator(ncclComm_t comm, std::string name, int64_t timeout_seconds);
  ~NcclCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  cudaStream_t stream() const { return stream_; }
  void all_reduce(float* data, int64_t n, ReduceOp op) override;
  void all_reduce(double* data, int64_t n, ReduceOp op) override;
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) override;
  void all_gather(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> all_gather_async(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                      ReduceOp op) override;
  std::unique_ptr<CommRequest> all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) override;
  void all_to_all(const float* send, float* recv, int64_t n) override;
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts) override;
  void send(const float* data, int64_t n, int peer) override;
  void recv(float* data, int64_t n, int peer) override;
  std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>& ops) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;
  // Host strings belong to the MPI (or self) communicator of ProcessGroups::checkpoint.
  std::vector<std::string> all_gather_strings(const std::string& mine) override;
  std::shared_ptr<Communicator> sub_group(int color, int key, const std::string& name) override { return split(color, key, name); }

  // Stream-ordered use from a compute stream, no host wait: the all-reduce starts once the work queued so
  // far on `after` is done; join(s) makes stream s wait for every collective queued so far.
  void all_reduce_after(float* data, int64_t n, ReduceOp op, cudaStream_t after);
  // The same on bf16 data (--grad-reduce-in-bf16).
  void all_reduce_bf16_after(void* data, int64_t n, ReduceOp op, cudaStream_t after);
  void join(cudaStream_t s);
  // This communicator's stream waits for the work queued so far on `after`.
  void follow(cudaStream_t after);
  // Uneven in-place blocks over [data, data + sum(counts)), rank r's block counts[r] elements: the
  // distributed optimizer's gradient reduction (rank r's block ends up holding the reduction of every
  // rank's block r; grouped ncclReduce) after the work queued on `after`, and its parameter gather (rank
  // r's block copied to every rank; grouped ncclBroadcast) queued on stream s. With equal blocks they are one
  // in-place ncclReduceScatter / ncclAllGather.
  void reduce_scatter_v_after(void* data, const std::vector<int64_t>& counts, WireType type, ReduceOp op, cudaStream_t after);
  void all_gather_v_on(void* data, const std::vector<int64_t>& counts, WireType type, cudaStream_t s);
  // StreamCollectives: queued on `s` itself (tensor parallelism inside a step).
  int group_rank() const override { return rank_; }
  int group_size() const override { return size_; }
  void all_reduce_on(void* data, int64_t n, WireType type, ReduceOp op, cudaStream_t s) override;
  void reduce_scatter_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) override;
  void all_gather_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) override;
  void all_to_all_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) override;
  void all_to_all_v_on(const void* send, const std::vector<int64_t>& send_counts, void* recv, const std::vector<int64_t>& recv_counts, WireType type,
                       cudaStream_t s) override;
  void send_recv_on(const std::vector<Transfer>& batch, WireType type, cudaStream_t s) override;
  void group_start() override;
  void group_end() override;
  std::shared_ptr<StreamCollectives> stream_sub_group(int color, int key, const std::string& name) override { return split(color, key, name); }
  // ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC); MEGATRAIN_NCCL_WINDOWS=0 on any rank
  // turns it off on all (nullptr). Freed with the communicator.
  void* alloc_window(size_t bytes) override;
  // Device memory the windows took, measured (cudaMemGetInfo) around each allocation and registration.
  size_t window_device_bytes() const { return window_device_bytes_; }
  // Waits for `event` (recorded on any stream whose work depends on this communicator's), watching for NCCL
  // errors and the timeout like wait_stream: a dead peer aborts the job instead of hanging it.
  void wait_event(cudaEvent_t event, const char* op);
  // Waits for the work queued so far on this communicator's stream, watching for NCCL errors and the
  // timeout; throws std::runtime_error (after aborting the communicator) on either.
  void wait_stream(const char* op);
  // The same for the work queued so far on another stream s (an event recorded there, waited for as wait_event).
  void host_wait_on(cudaStream_t s, const char* op) override;
  // A communicator of the ranks with the same color (ncclCommSplit), ordered by key.
  std::shared_ptr<NcclCommunicator> split(int color, int key, const std::string& name);

 private:
  std::unique_ptr<CommRequest> pending(const char* op);
  void wait_until(const std::function<cudaError_t()>& query, const char* op);
  ncclComm_t comm_;
  std::string name_;
  int64_t timeout_s_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<std::pair<ncclWindow_t, void*>> windows_;
  int windows_on_ = -1;              // agreed by the ranks at each alloc_window (MEGATRAIN_NCCL_WINDOWS; once off, off)
  size_t window_device_bytes_ = 0;  // what the windows took of the device (cudaMemGetInfo)
};

// The world communicator: the unique id is broadcast over MPI when MPI is active, else over `bootstrap`
// (the TCP world of a torchrun-style launch, comm/tcp_communicator.h). The calling process must already
// have selected its GPU.
std::shared_ptr<NcclCommunicator> make_nccl_world(const LaunchInfo& launch, int64_t timeout_seconds, Communicator* bootstrap = nullptr);
// What this rank's host thread is waiting for on NCCL, for another rank's question (comm/mpi_liveness.h).
std::string nccl_wait_description();
// The process groups of a layout as NCCL communicators split from world.
ProcessGroups make_nccl_process_groups(const std::shared_ptr<NcclCommunicator>& world, const RankLayout& layout, int64_t rank);

}  // namespace mt
