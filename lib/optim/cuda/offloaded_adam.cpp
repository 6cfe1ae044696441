// offloaded_adam.cpp: the offloaded optimizer's pieces, staging buffers and copy pipeline.
#include "optim/cuda/offloaded_adam.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include <sched.h>

#include "tensor/cuda/cuda_check.h"

namespace mt {
namespace {
constexpr int64_t kPieceElements = 8ll << 20;  // 32 MiB of fp32 gradients a piece
}

int offload_threads() {
  if (const char* env = std::getenv("MEGATRAIN_OFFLOAD_THREADS")) {
    const int n = std::atoi(env);
    if (n < 1) throw std::runtime_error("MEGATRAIN_OFFLOAD_THREADS must be a number of threads >= 1");
    return n;
  }
  // The cores this process may run on: a launcher that binds each rank (mpirun, srun) has already divided them.
  cpu_set_t set;
  CPU_ZERO(&set);
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : machine;
  if (allowed < machine) return std::max(1, allowed);
  // Unbound: the machine's cores shared among the ranks on it (the launcher's count, else the GPUs this rank sees).
  int ranks = 0;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"}) {
    if (const char* e = std::getenv(v)) ranks = std::max(ranks, std::atoi(e));
  }
  if (ranks < 1 && (cudaGetDeviceCount(&ranks) != cudaSuccess || ranks < 1)) ranks = 1;
  return std::max(1, machine / ranks);
}

OffloadedAdam::OffloadedAdam(std::vector<cuda::AdamChunk> chunks, float* master, float* exp_avg, float* exp_avg_sq, int threads)
    : chunks_(std::move(chunks)), w_(master), m_(exp_avg), v_(exp_avg_sq), pool_(threads) {
  // Pieces: runs of chunks contiguous in both index spaces, cut at about kPieceElements.
  for (int64_t i = 0; i < static_cast<int64_t>(chunks_.size()); ++i) {
    const cuda::AdamChunk& c = chunks_[static_cast<size_t>(i)];
    Piece* p = pieces_.empty() ? nullptr : &pieces_.back();
    const bool joins = p && p->start + p->len == c.start && p->state + p->len == c.state && p->len + c.len <= kPieceElements;
    if (!joins) {
      pieces_.push_back({i, i, c.start, c.state, 0});
      p = &pieces_.back();
    }
    p->last = i + 1;
    p->len += c.len;
  }
  int64_t widest = 1;
  for (const Piece& p : pieces_) widest = std::max(widest, p.len);
  for (int k = 0; k < kSlots; ++k) {
    MT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&grads_host_[k]), static_cast<size_t>(widest) * 4));
    MT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&weights_host_[k]), static_cast<size_t>(widest) * 2));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&down_ev_[k], cudaEventDisableTiming | cudaEventBlockingSync));
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&up_ev_[k], cudaEventDisableTiming | cudaEventBlockingSync));
  }
  MT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&state_host_), sizeof(cuda::StepState)));
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&state_ev_, cudaEventDisableTiming | cudaEventBlockingSync));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

OffloadedAdam::~OffloadedAdam() {
  if (up_) cudaStreamSynchronize(up_);
  if (down_) cudaStreamSynchronize(down_);
  for (int k = 0; k < kSlots; ++k) {
    cudaFreeHost(grads_host_[k]);
    cudaFreeHost(weights_host_[k]);
    cudaEventDestroy(down_ev_[k]);
    cudaEventDestroy(up_ev_[k]);
  }
  cudaFreeHost(state_host_);
  for (cudaEvent_t e : {ready_, state_ev_, done_}) cudaEventDestroy(e);
  cudaStreamDestroy(down_);
  cudaStreamDestroy(up_);
}

void OffloadedAdam::fetch(int64_t k) {  // piece k's gradients into its slot
  const Piece& p = pieces_[static_cast<size_t>(k)];
  const int slot = static_cast<int>(k % kSlots);
  MT_CUDA_CHECK(cudaMemcpyAsync(grads_host_[slot], d_grads_ + p.start, static_cast<size_t>(p.len) * 4, cudaMemcpyDeviceToHost, down_));
  MT_CUDA_CHECK(cudaEventRecord(down_ev_[slot], down_));
}

void OffloadedAdam::start(const float* d_grads, const cuda::StepState* d_state, cudaStream_t stream) {
  if (pieces_.empty()) return;
  d_grads_ = d_grads;
  MT_CUDA_CHECK(cudaEventRecord(ready_, stream));
  MT_CUDA_CHECK(cudaStreamWaitEvent(down_, ready_, 0));
  MT_CUDA_CHECK(cudaMemcpyAsync(state_host_, d_state, sizeof(cuda::StepState), cudaMemcpyDeviceToHost, down_));
  MT_CUDA_CHECK(cudaEventRecord(state_ev_, down_));
  // The first slots' gradients (their slots' last pieces were read by the host last step).
  for (int64_t k = 0; k < std::min<int64_t>(static_cast<int64_t>(pieces_.size()), kSlots); ++k) fetch(k);
}

void OffloadedAdam::finish(void* d_w16, cudaStream_t stream, const HostAdamStep& params, const std::function<void(cudaEvent_t)>& wait) {
  if (pieces_.empty()) return;
  const auto n = static_cast<int64_t>(pieces_.size());
  wait(state_ev_);
  const cuda::StepState st = *state_host_;
  if (st.skip) {  // no update (the device's weights stay); the next step's gradients wait for the copies under way
    MT_CUDA_CHECK(cudaEventRecord(done_, down_));
    MT_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
    return;
  }
  HostAdamStep s = params;
  s.scale = st.clip_coef * st.unscale;
  s.bc1 = st.bc1;
  s.bc2 = st.bc2;
  auto* w16 = static_cast<uint16_t*>(d_w16);
  for (int64_t k = 0; k < n; ++k) {
    const Piece& p = pieces_[static_cast<size_t>(k)];
    const int slot = static_cast<int>(k % kSlots);
    MT_CUDA_CHECK(cudaEventSynchronize(down_ev_[slot]));
    if (up_used_[slot]) MT_CUDA_CHECK(cudaEventSynchronize(up_ev_[slot]));  // its last weights have gone up
    const float* g = grads_host_[slot];
    uint16_t* out = weights_host_[slot];
    pool_.run(p.last - p.first, [&](int64_t i) {
      const cuda::AdamChunk& c = chunks_[static_cast<size_t>(p.first + i)];
      const int64_t off = c.start - p.start;
      HostAdamStep sc = s;
      if (c.decoupled && s.decoupled_lr >= 0.0f) sc.lr = s.decoupled_lr;
      host_adamw(w_ + c.state, m_ + c.state, v_ + c.state, g + off, out + off, c.len, c.decay != 0, sc);
    });
    MT_CUDA_CHECK(cudaMemcpyAsync(w16 + p.start, out, static_cast<size_t>(p.len) * 2, cudaMemcpyHostToDevice, up_));
    MT_CUDA_CHECK(cudaEventRecord(up_ev_[slot], up_));
    up_used_[slot] = true;
    if (k + kSlots < n) fetch(k + kSlots);  // this slot's gradients were read
  }
  MT_CUDA_CHECK(cudaEventRecord(done_, up_));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
}

double OffloadedAdam::master_sumsq() {
  std::vector<double> part(chunks_.size());
  pool_.run(static_cast<int64_t>(chunks_.size()), [&](int64_t i) {
    const cuda::AdamChunk& c = chunks_[static_cast<size_t>(i)];
    double sq = 0;
    for (int64_t j = 0; j < c.len; ++j) sq += static_cast<double>(w_[c.state + j]) * w_[c.state + j];
    part[static_cast<size_t>(i)] = sq * c.norm_weight;
  });
  double total = 0;
  for (double x : part) total += x;
  return total;
}

}  // namespace mt
