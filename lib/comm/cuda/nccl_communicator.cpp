// nccl_communicator.cpp: NCCL collectives with bounded waits.
#include "comm/cuda/nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "comm/mpi_communicator.h"
#include "comm/mpi_liveness.h"
#include "comm/process_groups.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {
namespace {

// The host wait in flight (for the answer to another rank's question, comm/mpi_liveness.h).
std::atomic<int64_t> g_wait_since_ns{0};
std::atomic<const char*> g_wait_op{""};
std::mutex g_wait_mu;
char g_wait_group[64] = {};  // under g_wait_mu

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : op == ReduceOp::kAvg ? ncclAvg : ncclSum; }
ncclDataType_t nccl_type(WireType t) { return t == WireType::kBF16 ? ncclBfloat16 : t == WireType::kF16 ? ncclHalf : ncclFloat; }

class EventRequest final : public CommRequest {
 public:
  EventRequest(NcclCommunicator* comm, const char* op) : comm_(comm), op_(op) {}
  void wait() override {
    if (!done_) comm_->wait_stream(op_);
    done_ = true;
  }

 private:
  NcclCommunicator* comm_;
  const char* op_;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(ncclComm_t comm, std::string name, int64_t timeout_seconds)
    : comm_(comm), name_(std::move(name)), timeout_s_(timeout_seconds) {
  MT_NCCL_CHECK(ncclCommCount(comm_, &size_));
  MT_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
  // Highest priority: a collective overlapping compute gets SMs as soon as it is ready, not after the
  // GEMM queued beside it.
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
}

NcclCommunicator::~NcclCommunicator() {
  for (auto& [win, ptr] : windows_) {
    if (!aborted_) ncclCommWindowDeregister(comm_, win);
    ncclMemFree(ptr);
  }
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
  if (!aborted_) ncclCommDestroy(comm_);
}

void NcclCommunicator::wait_stream(const char* op) { wait_until([this] { return cudaStreamQuery(stream_); }, op); }

void NcclCommunicator::wait_event(cudaEvent_t event, const char* op) { wait_until([event] { return cudaEventQuery(event); }, op); }

void NcclCommunicator::host_wait_on(cudaStream_t s, const char* op) {
  cudaEvent_t ev = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { cudaEventDestroy(e); }
  } destroy{ev};
  MT_CUDA_CHECK(cudaEventRecord(ev, s));
  wait_event(ev, op);
}

std::string nccl_wait_description() {
  std::lock_guard<std::mutex> lock(g_wait_mu);
  const int64_t since = g_wait_since_ns.load();
  if (since == 0) return "is running (not waiting for NCCL)";
  char buf[200];
  std::snprintf(buf, sizeof(buf), "has waited %.1f s for NCCL %s on the %s group", static_cast<double>(steady_ns() - since) / 1e9, g_wait_op.load(),
                g_wait_group);
  return buf;
}

void NcclCommunicator::wait_until(const std::function<cudaError_t()>& query, const char* op) {
  const auto start = std::chrono::steady_clock::now();
  bool marked = false;
  struct Unmark {
    bool& marked;
    ~Unmark() {
      if (marked) g_wait_since_ns = 0;
    }
  } unmark{marked};
  for (;;) {
    const cudaError_t q = query();
    if (q == cudaSuccess) return;
    if (!marked) {
      std::lock_guard<std::mutex> lock(g_wait_mu);
      g_wait_op = op;
      std::snprintf(g_wait_group, sizeof(g_wait_group), "%s", name_.c_str());
      g_wait_since_ns = steady_ns();
      marked = true;
    }
    if (q != cudaErrorNotReady) MT_CUDA_CHECK(q);
    ncclResult_t async = ncclSuccess;
    MT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    const bool late = std::chrono::steady_clock::now() - start > std::chrono::seconds(timeout_s_);
    if (async != ncclSuccess || late) {
      // Under mpirun the other ranks are asked first: the one that stopped does not answer.
      std::string who = late ? ask_other_ranks(3.0) : std::string();
      if (who.empty()) who = "another rank has probably failed";
      ncclCommAbort(comm_);
      aborted_ = true;
      throw std::runtime_error(std::string("NCCL ") + op + " on the " + name_ + " group " +
                               (late ? "did not finish in " + std::to_string(timeout_s_) + " s" : std::string("failed: ") + ncclGetErrorString(async)) +
                               ": " + who + "; communicator aborted (--distributed-timeout-seconds)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::unique_ptr<CommRequest> NcclCommunicator::pending(const char* op) { return std::make_unique<EventRequest>(this, op); }

void NcclCommunicator::all_reduce(float* data, int64_t n, ReduceOp op) { all_reduce_async(data, n, op)->wait(); }

void NcclCommunicator::all_reduce_after(float* data, int64_t n, ReduceOp op, cudaStream_t after) {
  follow(after);
  MT_PROF_ON(stream_, "dp.all_reduce", MT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, nccl_op(op), comm_, stream_)));
}

void NcclCommunicator::all_reduce_bf16_after(void* data, int64_t n, ReduceOp op, cudaStream_t after) {
  follow(after);
  MT_PROF_ON(stream_, "dp.all_reduce", MT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclBfloat16, nccl_op(op), comm_, stream_)));
}

void NcclCommunicator::follow(cudaStream_t after) {
  if (!ready_) MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventRecord(ready_, after));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

void NcclCommunicator::join(cudaStream_t s) {
  if (!done_) MT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventRecord(done_, stream_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
}

void NcclCommunicator::all_reduce_on(void* data, int64_t n, WireType type, ReduceOp op, cudaStream_t s) {
  MT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), nccl_type(type), nccl_op(op), comm_, s));
}

void NcclCommunicator::reduce_scatter_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) {
  MT_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(n_per_rank), nccl_type(type), ncclSum, comm_, s));
}

void NcclCommunicator::all_gather_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) {
  MT_NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(n_per_rank), nccl_type(type), comm_, s));
}

void NcclCommunicator::all_to_all_on(const void* send, void* recv, int64_t n_per_rank, WireType type, cudaStream_t s) {
  MT_NCCL_CHECK(ncclAlltoAll(send, recv, static_cast<size_t>(n_per_rank), nccl_type(type), comm_, s));
}

void NcclCommunicator::all_to_all_v_on(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                                       const std::vector<int64_t>& recv_counts, WireType type, cudaStream_t s) {
  if (send_counts.size() != static_cast<size_t>(size_) || recv_counts.size() != static_cast<size_t>(size_)) {
    throw std::logic_error("all_to_all_v: one count per rank expected");
  }
  const size_t elem = type == WireType::kF32 ? 4 : 2;
  const auto so = count_offsets(send_counts), ro = count_offsets(recv_counts);
  MT_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    const auto q = static_cast<size_t>(r);
    MT_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + static_cast<size_t>(so[q]) * elem, static_cast<size_t>(send_counts[q]), nccl_type(type), r,
                           comm_, s));
    MT_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + static_cast<size_t>(ro[q]) * elem, static_cast<size_t>(recv_counts[q]), nccl_type(type), r, comm_, s));
  }
  MT_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::send_recv_on(const std::vector<Transfer>& batch, WireType type, cudaStream_t s) {
  MT_NCCL_CHECK(ncclGroupStart());
  for (const Transfer& t : batch) {
    if (t.peer < 0 || t.peer >= size_) throw std::logic_error("send_recv: peer " + std::to_string(t.peer) + " is not in the " + name_ + " group");
    if (t.send) MT_NCCL_CHECK(ncclSend(t.data, static_cast<size_t>(t.n), nccl_type(type), t.peer, comm_, s));
    else MT_NCCL_CHECK(ncclRecv(t.data, static_cast<size_t>(t.n), nccl_type(type), t.peer, comm_, s));
  }
  MT_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::reduce_scatter_v_after(void* data, const std::vector<int64_t>& counts, WireType type, ReduceOp op, cudaStream_t after) {
  follow(after);
  const size_t elem = type == WireType::kF32 ? 4 : 2;
  auto* base = static_cast<char*>(data);
  const ProfScope prof("dp.reduce_to_owners", stream_);
  if (counts.size() != static_cast<size_t>(size_)) throw std::logic_error("reduce_scatter_v_after: one count per rank expected");
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts.front(); })) {
    // Equal blocks: one in-place reduce-scatter (on a symmetric window NCCL runs its symmetric kernel, which
    // a group of reduces never gets).
    const auto n = static_cast<size_t>(counts.front());
    MT_NCCL_CHECK(ncclReduceScatter(base, base + static_cast<size_t>(rank_) * n * elem, n, nccl_type(type), nccl_op(op), comm_, stream_));
    return;
  }
  MT_NCCL_CHECK(ncclGroupStart());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
    void* block = base + static_cast<size_t>(off) * elem;
    MT_NCCL_CHECK(ncclReduce(block, r == rank_ ? block : nullptr, n, nccl_type(type), nccl_op(op), r, comm_, stream_));
    off += counts[static_cast<size_t>(r)];
  }
  MT_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::all_gather_v_on(void* data, const std::vector<int64_t>& counts, WireType type, cudaStream_t s) {
  const size_t elem = type == WireType::kF32 ? 4 : 2;
  auto* base = static_cast<char*>(data);
  if (counts.size() != static_cast<size_t>(size_)) throw std::logic_error("all_gather_v_on: one count per rank expected");
  if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts.front(); })) {
    const auto n = static_cast<size_t>(counts.front());  // equal blocks: one in-place all-gather
    MT_NCCL_CHECK(ncclAllGather(base + static_cast<size_t>(rank_) * n * elem, base, n, nccl_type(type), comm_, s));
    return;
  }
  MT_NCCL_CHECK(ncclGroupStart());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    void* block = base + static_cast<size_t>(off) * elem;
    MT_NCCL_CHECK(ncclBroadcast(block, block, static_cast<size_t>(counts[static_cast<size_t>(r)]), nccl_type(type), r, comm_, s));
    off += counts[static_cast<size_t>(r)];
  }
  MT_NCCL_CHECK(ncclGroupEnd());
}

void NcclCommunicator::group_start() { MT_NCCL_CHECK(ncclGroupStart()); }
void NcclCommunicator::group_end() { MT_NCCL_CHECK(ncclGroupEnd()); }

void NcclCommunicator::all_reduce(double* data, int64_t n, ReduceOp op) {
  MT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclDouble, nccl_op(op), comm_, stream_));
  wait_stream("all-reduce");
}

std::unique_ptr<CommRequest> NcclCommunicator::all_reduce_async(float* data, int64_t n, ReduceOp op) {
  MT_NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, nccl_op(op), comm_, stream_));
  return pending("all-reduce");
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, int64_t n, ReduceOp op) {
  MT_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(n), ncclFloat, nccl_op(op), comm_, stream_));
  wait_stream("reduce-scatter");
}

void NcclCommunicator::all_gather(const float* send, float* recv, int64_t n) { all_gather_async(send, recv, n)->wait(); }

std::unique_ptr<CommRequest> NcclCommunicator::all_gather_async(const float* send, float* recv, int64_t n) {
  MT_NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat, comm_, stream_));
  return pending("all-gather");
}

// Uneven blocks: one reduce (or broadcast) per owning rank, grouped into one launch.
std::unique_ptr<CommRequest> NcclCommunicator::reduce_scatter_v_async(const float* full, float* mine,
                                                                      const std::vector<int64_t>& counts, ReduceOp op) {
  MT_NCCL_CHECK(ncclGroupStart());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
    MT_NCCL_CHECK(ncclReduce(full + off, r == rank_ ? mine : nullptr, n, ncclFloat, nccl_op(op), r, comm_, stream_));
    off += counts[static_cast<size_t>(r)];
  }
  MT_NCCL_CHECK(ncclGroupEnd());
  return pending("reduce-scatter");
}

std::unique_ptr<CommRequest> NcclCommunicator::all_gather_v_async(const float* mine, float* full, const std::vector<int64_t>& counts) {
  MT_NCCL_CHECK(ncclGroupStart());
  int64_t off = 0;
  for (int r = 0; r < size_; ++r) {
    const auto n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
    MT_NCCL_CHECK(ncclBroadcast(r == rank_ ? mine : full + off, full + off, n, ncclFloat, r, comm_, stream_));
    off += counts[static_cast<size_t>(r)];
  }
  MT_NCCL_CHECK(ncclGroupEnd());
  return pending("all-gather");
}

void NcclCommunicator::all_to_all(const float* send, float* recv, int64_t n) {
  MT_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    MT_NCCL_CHECK(ncclSend(send + r * n, static_cast<size_t>(n), ncclFloat, r, comm_, stream_));
    MT_NCCL_CHECK(ncclRecv(recv + r * n, static_cast<size_t>(n), ncclFloat, r, comm_, stream_));
  }
  MT_NCCL_CHECK(ncclGroupEnd());
  wait_stream("all-to-all");
}

void NcclCommunicator::all_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                                    const std::vector<int64_t>& recv_counts) {
  all_to_all_v_on(send, send_counts, recv, recv_counts, WireType::kF32, stream_);
  wait_stream("all-to-all");
}

std::unique_ptr<CommRequest> NcclCommunicator::send_recv_batch_async(const std::vector<P2POp>& ops) {
  std::vector<Transfer> batch;
  for (const P2POp& op : ops) batch.push_back({op.kind == P2POp::Kind::kSend, op.data, op.n, op.peer});
  send_recv_on(batch, WireType::kF32, stream_);
  return pending("send/receive batch");
}

void NcclCommunicator::send(const float* data, int64_t n, int peer) {
  MT_NCCL_CHECK(ncclSend(data, static_cast<size_t>(n), ncclFloat, peer, comm_, stream_));
  wait_stream("send");
}

void NcclCommunicator::recv(float* data, int64_t n, int peer) {
  MT_NCCL_CHECK(ncclRecv(data, static_cast<size_t>(n), ncclFloat, peer, comm_, stream_));
  wait_stream("recv");
}

void NcclCommunicator::broadcast(void* data, int64_t bytes, int root) {
  MT_NCCL_CHECK(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclChar, root, comm_, stream_));
  wait_stream("broadcast");
}

void NcclCommunicator::barrier() {
  float* one = nullptr;
  MT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_));
  MT_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm_, stream_));
  MT_CUDA_CHECK(cudaFreeAsync(one, stream_));
  wait_stream("barrier");
}

std::vector<std::string> NcclCommunicator::all_gather_strings(const std::string&) {
  throw std::logic_error("NCCL communicators carry device buffers; host strings go through ProcessGroups::checkpoint");
}

namespace {

// The element-wise max over the ranks of a few host doubles (exact for sizes below 2^53), through a device
// buffer: the agreements alloc_window needs before its collective registration.
std::vector<double> max_over_ranks(NcclCommunicator& comm, std::vector<double> v) {
  double* d = nullptr;
  MT_CUDA_CHECK(cudaMalloc(&d, v.size() * sizeof(double)));
  MT_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice));
  comm.all_reduce(d, static_cast<int64_t>(v.size()), ReduceOp::kMax);
  MT_CUDA_CHECK(cudaMemcpy(v.data(), d, v.size() * sizeof(double), cudaMemcpyDeviceToHost));
  MT_CUDA_CHECK(cudaFree(d));
  return v;
}

}  // namespace

void* NcclCommunicator::alloc_window(size_t bytes) {
  if (size_ < 2) return nullptr;
  // Registration is collective and needs the same size on every rank: the ranks agree first (off on any
  // rank: off on all; a size that differs is a bug, named here rather than hanging in NCCL).
  bytes = (std::max<size_t>(bytes, 1) + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT * NCCL_WIN_REQUIRED_ALIGNMENT;
  const char* env = std::getenv("MEGATRAIN_NCCL_WINDOWS");
  const bool off_here = windows_on_ == 0 || (env != nullptr && std::string(env) == "0");
  const auto agreed = max_over_ranks(*this, {off_here ? 1.0 : 0.0, static_cast<double>(bytes), -static_cast<double>(bytes)});
  windows_on_ = agreed[0] > 0.0 ? 0 : 1;
  if (windows_on_ == 0) return nullptr;
  if (agreed[1] != -agreed[2]) {
    throw std::logic_error("the " + name_ + " group's ranks asked for NCCL windows of different sizes (" + std::to_string(bytes) + " bytes here)");
  }
  void* ptr = nullptr;
  size_t free_before = 0, free_after = 0, total = 0;
  MT_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  const bool failed_here = ncclMemAlloc(&ptr, bytes) != ncclSuccess || ptr == nullptr;
  // Every rank learns whether every rank has its memory, so that all register or none do.
  if (max_over_ranks(*this, {failed_here ? 1.0 : 0.0})[0] > 0.0) {
    if (!failed_here) ncclMemFree(ptr);
    throw std::runtime_error("out of GPU memory allocating " + std::to_string(bytes >> 20) + " MiB for the " + name_ + " group's NCCL window" +
                             (failed_here ? "" : " on another rank") +
                             ": free GPU memory (a smaller --micro-batch-size or model), or set MEGATRAIN_NCCL_WINDOWS=0");
  }
  ncclWindow_t win{};
  const ncclResult_t r = ncclCommWindowRegister(comm_, ptr, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
  if (r != ncclSuccess) {
    ncclMemFree(ptr);
    throw std::runtime_error(std::string("NCCL could not register a symmetric window on the ") + name_ + " group (" +
                             ncclGetErrorString(r) + "): set MEGATRAIN_NCCL_WINDOWS=0 to run without windows");
  }
  windows_.emplace_back(win, ptr);
  // What the window took of the device (ncclMemAlloc rounds up to its allocation granularity; registration
  // may map more): the start-up memory line reports it.
  MT_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  window_device_bytes_ += free_before > free_after ? free_before - free_after : bytes;
  return ptr;
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  ncclComm_t sub = nullptr;
  MT_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
  if (sub == nullptr) return nullptr;  // NCCL_SPLIT_NOCOLOR: not a member
  return std::make_shared<NcclCommunicator>(sub, name, timeout_s_);
}

std::shared_ptr<NcclCommunicator> make_nccl_world(const LaunchInfo& launch, int64_t timeout_seconds, Communicator* bootstrap) {
  ncclUniqueId id{};
  if (launch.rank == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
  std::string blob(reinterpret_cast<const char*>(&id), sizeof(id));
  if (mpi_active()) {
    MPI_Bcast(blob.data(), static_cast<int>(blob.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  } else if (bootstrap != nullptr && bootstrap->size() == launch.world_size) {
    bootstrap->broadcast(blob.data(), static_cast<int64_t>(blob.size()), 0);
  } else {
    throw std::logic_error("make_nccl_world: without MPI the unique id needs the world's TCP communicator");
  }
  std::memcpy(&id, blob.data(), sizeof(id));  // both broadcasts deliver exactly sizeof(id) bytes
  ncclComm_t comm = nullptr;
  // NCCL's zero-CTA policy (unless NCCL_CTA_POLICY says otherwise): gathers on symmetric windows go to the
  // copy engines, leaving every SM to the GEMMs they overlap; the groups split from this one inherit it.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (std::getenv("NCCL_CTA_POLICY") == nullptr) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  MT_NCCL_CHECK(ncclCommInitRankConfig(&comm, static_cast<int>(launch.world_size), id, static_cast<int>(launch.rank), &config));
  return std::make_shared<NcclCommunicator>(comm, "world", timeout_seconds);
}

ProcessGroups make_nccl_process_groups(const std::shared_ptr<NcclCommunicator>& world, const RankLayout& layout, int64_t r) {
  ProcessGroups g = split_layout_groups(layout, r, [&](int color, int key, const std::string& name) -> std::shared_ptr<Communicator> {
    return world->split(color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, name);
  });
  g.world = world;
  g.checkpoint = nullptr;  // host data: the caller supplies an MPI or TCP communicator
  return g;
}

}  // namespace mt
