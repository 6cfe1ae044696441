// mpi_communicator.h: Communicator over MPI for host (CPU) buffers, the process groups of a rank
// layout as MPI sub-communicators, and the collective watchdog that turns a hang after another rank's
// failure into an exit with a message within --distributed-timeout-seconds.
#pragma once

#include <mpi.h>

#include <string>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "parallel/rank_layout.h"

namespace mt {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (freed unless it is MPI_COMM_WORLD). watched: the collective watchdog
  // covers this communicator's calls (not for checkpoint I/O, whose waits are long by nature).
  MpiCommunicator(MPI_Comm comm, std::string name, bool watched = true);
  ~MpiCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(float* data, int64_t n, ReduceOp op) override;
  void all_reduce(double* data, int64_t n, ReduceOp op) override;
  std::unique_ptr<CommRequest> all_reduce_async(float* data, int64_t n, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) override;
  void all_gather(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> all_gather_async(const float* send, float* recv, int64_t n) override;
  void all_to_all(const float* send, float* recv, int64_t n) override;
  std::unique_ptr<CommRequest> reduce_scatter_v_async(const float* full, float* mine, const std::vector<int64_t>& counts,
                                                      ReduceOp op) override;
  std::unique_ptr<CommRequest> all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) override;
  void all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts) override;
  void send(const float* data, int64_t n, int peer) override;
  void recv(float* data, int64_t n, int peer) override;
  std::unique_ptr<CommRequest> send_recv_batch_async(const std::vector<P2POp>& ops) override;
  void broadcast(void* data, int64_t bytes, int root) override;
  void barrier() override;
  std::vector<std::string> all_gather_strings(const std::string& mine) override;
  std::shared_ptr<Communicator> sub_group(int color, int key, const std::string& name) override;

 private:
  template <typename T>
  void all_reduce_impl(T* data, int64_t n, ReduceOp op, MPI_Datatype type);
  MPI_Comm comm_;
  std::string name_;
  bool watched_ = true;
  int rank_ = 0, size_ = 1;
};

// MPI_THREAD_MULTIPLE was granted (needed for collectives from a background checkpoint thread).
bool mpi_thread_multiple();

// MPI_Init_thread once (when launched by mpirun / srun); the world rank and size.
void mpi_initialize(int* argc, char*** argv);
bool mpi_active();
void mpi_finalize();
// Prints the message on this rank and aborts the whole job (never returns).
[[noreturn]] void mpi_abort_job(int code);

// Every group of `layout` this rank belongs to, as MPI communicators.
ProcessGroups make_mpi_process_groups(const RankLayout& layout, int64_t world_rank);

// Starts the watchdog: a collective that has not completed after `timeout_seconds` aborts the job
// with a message naming the operation and the group.
void start_collective_watchdog(int64_t timeout_seconds, int64_t world_rank);

}  // namespace mt
