// thread_collectives.h: the CUDA model's stream collectives between threads of one process on one GPU, so that
// parallel layouts (context, tensor and expert parallelism) can be checked without several GPUs. Each rank is a thread with
// its own model and stream; only one thread runs host code at a time (the engine's singletons assume one): it holds
// the Baton's mutex and lets go of it only while it waits inside a collective. A collective waits for its stream,
// meets the group's other ranks, moves or reduces their device buffers with plain copies (rank 0 of the group reduces
// on the host), waits for the device and meets them again, so no rank reuses a buffer a peer still reads. NCCL cannot
// do this: it refuses two ranks on one GPU. (The caching allocator and cuDNN's workspaces are shared by the threads:
// safe because every collective here waits for the stream it is given, and the model records its compute stream's
// work on that stream's event before each one; a collective on a side stream without that would not be.)
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/cuda/stream_collectives.h"
#include "tensor/dtype.h"

namespace mt::test {

struct Baton {
  std::mutex m;
  std::condition_variable cv;
  bool failed = false;  // a rank threw: every waiting rank throws too
};
inline thread_local std::unique_lock<std::mutex>* baton_held = nullptr;  // this thread's hold on Baton::m

// One group's meeting point.
struct ThreadGroup {
  ThreadGroup(Baton& b, int n)
      : baton(b),
        size(n),
        posted(static_cast<size_t>(n)),
        sends(static_cast<size_t>(n)),
        recvs(static_cast<size_t>(n)),
        send_counts(static_cast<size_t>(n)),
        signatures(static_cast<size_t>(n)) {}
  Baton& baton;
  int size;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<std::vector<StreamCollectives::Transfer>> posted;
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  std::vector<std::vector<int64_t>> send_counts;  // all_to_all_v_on: each rank's counts per destination
  std::vector<std::string> signatures;             // each rank's collective: its kind, size and type (they must agree)
};

class ThreadCollectives final : public StreamCollectives {
 public:
  ThreadCollectives(ThreadGroup& group, int rank) : g_(group), rank_(rank) {}
  int group_rank() const override { return rank_; }
  int group_size() const override { return g_.size; }

  // The k-th receive from a peer takes the k-th send of that peer to this rank (each in the order posted).
  void send_recv_on(const std::vector<Transfer>& batch, WireType type, cudaStream_t s) override {
    wait_stream(s);
    g_.posted[static_cast<size_t>(rank_)] = batch;
    barrier();
    std::vector<int> taken(static_cast<size_t>(g_.size), 0);
    for (const Transfer& t : batch) {
      if (t.send) continue;
      int k = taken[static_cast<size_t>(t.peer)]++;
      const Transfer* match = nullptr;
      for (const Transfer& u : g_.posted[static_cast<size_t>(t.peer)]) {
        if (u.send && u.peer == rank_ && k-- == 0) {
          match = &u;
          break;
        }
      }
      if (!match || match->n != t.n) throw std::runtime_error("thread collectives: a receive without its matching send");
      copy(t.data, match->data, static_cast<size_t>(t.n) * bytes_of(type));
    }
    finish();
  }
  // recv[r n ..) = rank r's send.
  void all_gather_on(const void* send, void* recv, int64_t n, WireType type, cudaStream_t s) override {
    post(s, send, recv, "all_gather", n, type);
    const size_t bytes = static_cast<size_t>(n) * bytes_of(type);
    for (int r = 0; r < g_.size; ++r) copy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, g_.sends[static_cast<size_t>(r)], bytes);
    finish();
  }
  // recv[r n ..) = rank r's send[this rank's n ..).
  void all_to_all_on(const void* send, void* recv, int64_t n, WireType type, cudaStream_t s) override {
    post(s, send, recv, "all_to_all", n, type);
    const size_t bytes = static_cast<size_t>(n) * bytes_of(type);
    for (int r = 0; r < g_.size; ++r) {
      copy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, static_cast<const char*>(g_.sends[static_cast<size_t>(r)]) + static_cast<size_t>(rank_) * bytes,
           bytes);
    }
    finish();
  }
  void all_reduce_on(void* data, int64_t n, WireType type, ReduceOp op, cudaStream_t s) override {
    post(s, data, data, op == ReduceOp::kMax ? "all_reduce(max)" : op == ReduceOp::kAvg ? "all_reduce(avg)" : "all_reduce(sum)", n, type);
    if (rank_ == 0) {
      const std::vector<float> sum = reduce(0, n, type, op);
      for (int r = 0; r < g_.size; ++r) upload(g_.recvs[static_cast<size_t>(r)], sum, type);
    }
    finish();
  }
  // recv[n] = the sum over ranks of send[rank n ..).
  void reduce_scatter_on(const void* send, void* recv, int64_t n, WireType type, cudaStream_t s) override {
    post(s, send, recv, "reduce_scatter", n, type);
    if (rank_ == 0) {
      for (int r = 0; r < g_.size; ++r) upload(g_.recvs[static_cast<size_t>(r)], reduce(r * n, n, type, ReduceOp::kSum), type);
    }
    finish();
  }
  // recv holds rank r's block for this rank (recv_counts[r] elements, r in order); each rank's send holds its blocks in
  // destination order.
  void all_to_all_v_on(const void* send, const std::vector<int64_t>& send_counts, void* recv, const std::vector<int64_t>& recv_counts, WireType type,
                       cudaStream_t s) override {
    g_.send_counts[static_cast<size_t>(rank_)] = send_counts;
    post(s, send, recv, "all_to_all_v", -1, type);  // (the counts are checked below)
    const size_t e = bytes_of(type);
    size_t at = 0;
    for (int r = 0; r < g_.size; ++r) {
      const std::vector<int64_t>& theirs = g_.send_counts[static_cast<size_t>(r)];
      if (theirs.size() != static_cast<size_t>(g_.size) || recv_counts.size() != static_cast<size_t>(g_.size) ||
          theirs[static_cast<size_t>(rank_)] != recv_counts[static_cast<size_t>(r)]) {
        throw std::runtime_error("thread collectives: all_to_all_v_on's counts do not match between the ranks");
      }
      int64_t offset = 0;
      for (int q = 0; q < rank_; ++q) offset += theirs[static_cast<size_t>(q)];
      const auto n = static_cast<size_t>(recv_counts[static_cast<size_t>(r)]);
      if (n > 0) copy(static_cast<char*>(recv) + at * e, static_cast<const char*>(g_.sends[static_cast<size_t>(r)]) + static_cast<size_t>(offset) * e, n * e);
      at += n;
    }
    finish();
  }
  void group_start() override {}  // (each collective completes as it is called)
  void group_end() override {}
  std::shared_ptr<StreamCollectives> stream_sub_group(int, int, const std::string&) override {
    throw std::logic_error("thread collectives: sub-groups are not implemented (K/V replication over TP)");
  }

 private:
  static size_t bytes_of(WireType t) { return t == WireType::kF32 ? 4 : 2; }
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("thread collectives: ") + what + ": " + cudaGetErrorString(e));
  }
  static void wait_stream(cudaStream_t s) { check(cudaStreamSynchronize(s), "the stream failed"); }
  static void copy(void* to, const void* from, size_t bytes) { check(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice), "a copy failed"); }
  // Every rank of the group must call the same collective with the same size and type (NCCL's rule; a mismatch there
  // hangs or mixes buffers): each posts its signature and, after the meeting, checks every other rank's.
  void post(cudaStream_t s, const void* send, void* recv, const char* kind, int64_t n, WireType type) {
    wait_stream(s);
    g_.sends[static_cast<size_t>(rank_)] = send;
    g_.recvs[static_cast<size_t>(rank_)] = recv;
    const std::string mine = std::string(kind) + " of " + std::to_string(n) + " x " + std::to_string(bytes_of(type)) + " bytes";
    g_.signatures[static_cast<size_t>(rank_)] = mine;
    barrier();
    for (int r = 0; r < g_.size; ++r) {
      if (g_.signatures[static_cast<size_t>(r)] != mine) {
        throw std::runtime_error("thread collectives: the ranks called different collectives (rank " + std::to_string(rank_) + ": " + mine + "; rank " +
                                 std::to_string(r) + ": " + g_.signatures[static_cast<size_t>(r)] + ")");
      }
    }
  }
  // (device-to-device cudaMemcpy may return before the copy ends: every copy done before any rank goes on)
  void finish() {
    check(cudaDeviceSynchronize(), "a copy failed");
    barrier();
  }
  // The reduction over the ranks of n elements from element `at` of each send, in fp32.
  std::vector<float> reduce(int64_t at, int64_t n, WireType type, ReduceOp op) {
    std::vector<float> out(static_cast<size_t>(n), 0.0f), one(static_cast<size_t>(n));
    std::vector<uint16_t> half(static_cast<size_t>(n));
    for (int r = 0; r < g_.size; ++r) {
      const char* from = static_cast<const char*>(g_.sends[static_cast<size_t>(r)]) + static_cast<size_t>(at) * bytes_of(type);
      if (type == WireType::kF32) {
        check(cudaMemcpy(one.data(), from, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost), "a download failed");
      } else {
        check(cudaMemcpy(half.data(), from, static_cast<size_t>(n) * 2, cudaMemcpyDeviceToHost), "a download failed");
        for (size_t i = 0; i < half.size(); ++i) one[i] = type == WireType::kBF16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
      }
      for (size_t i = 0; i < out.size(); ++i) out[i] = op == ReduceOp::kMax ? (r == 0 ? one[i] : std::max(out[i], one[i])) : out[i] + one[i];
    }
    if (op == ReduceOp::kAvg) {
      for (float& x : out) x /= static_cast<float>(g_.size);
    }
    return out;
  }
  static void upload(void* to, const std::vector<float>& v, WireType type) {
    if (type == WireType::kF32) {
      check(cudaMemcpy(to, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "an upload failed");
      return;
    }
    std::vector<uint16_t> half(v.size());
    for (size_t i = 0; i < v.size(); ++i) half[i] = type == WireType::kBF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
    check(cudaMemcpy(to, half.data(), half.size() * 2, cudaMemcpyHostToDevice), "an upload failed");
  }
  void barrier() {
    Baton& b = g_.baton;
    const int64_t gen = g_.generation;
    if (++g_.arrived == g_.size) {
      g_.arrived = 0;
      ++g_.generation;
      b.cv.notify_all();
    } else {
      if (baton_held == nullptr) throw std::logic_error("thread collectives: called from a thread without the baton");
      b.cv.wait(*baton_held, [&] { return g_.generation != gen || b.failed; });
    }
    if (b.failed) throw std::runtime_error("thread collectives: another rank failed");
  }
  ThreadGroup& g_;
  int rank_;
};

// Runs rank(i) for i in [0, n), each in a thread holding the baton but while it waits in a collective; rethrows a
// rank's exception after every thread ended (the root cause first: the other ranks only say another rank failed).
inline void run_ranks(Baton& baton, size_t n, const std::function<void(size_t)>& rank) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::unique_lock<std::mutex> lock(baton.m);
      baton_held = &lock;
      try {
        rank(i);
      } catch (const std::exception& e) {
        errors[i] = e.what();
        baton.failed = true;
        baton.cv.notify_all();
      }
      baton_held = nullptr;
    });
  }
  for (auto& th : threads) th.join();
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::string& e : errors) {
      if (!e.empty() && (pass == 1 || e.find("another rank failed") == std::string::npos)) throw std::runtime_error(e);
    }
  }
}

}  // namespace mt::test
