// test_cuda_context_parallel.cpp: the CUDA model's context parallelism (model/cuda/gpt_cuda_context.cpp) on one GPU.
// CP ranks run as threads of one process, each with its own model and stream, linked by an in-process ring (each
// batch of sends and receives copied between the threads' buffers); only one thread runs host code at a time (the
// engine's singletons assume one), the others wait inside the ring's collectives. Each rank forwards and backwards its
// two chunks of every sequence (context_parallel_slice); the ranks' gradients summed and their losses summed must be
// the whole sequence's on one model (bf16 tolerance): the ring's order, the block kinds, the travelling K/V gradients,
// the positions; and for --cp-comm-type a2a the all-to-alls' layouts (an in-process all-to-all). The NCCL collectives
// themselves (the engine's) need 2+ GPUs. Exit 77 (skipped) where no GPU is visible.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "device_buffers.h"
#include "gpu_check.h"
#include "config/cli.h"
#include "config/resolve.h"
#include "model/context_parallel.h"
#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "tensor/device_info.h"
#include "train/microbatch_staging.h"
#include "train/train_common.h"

namespace {

using mt::test::check;
using mt::test::download;
using mt::test::failures;
using mt::test::rel_err;

// The ranks' shared state: one mutex that the running thread holds (released while it waits in a collective), a
// barrier, and each rank's posted batch.
struct RingShared {
  explicit RingShared(int n) : size(n), posted(static_cast<size_t>(n)) {}
  int size;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  bool failed = false;
  std::vector<std::vector<mt::StreamCollectives::Transfer>> posted;
  std::vector<const void*> sends = std::vector<const void*>(static_cast<size_t>(size));  // each rank's all-to-all input
};
thread_local std::unique_lock<std::mutex>* held = nullptr;  // this thread's hold on RingShared::m

class ThreadRing final : public mt::StreamCollectives {
 public:
  ThreadRing(RingShared& shared, int rank) : shared_(shared), rank_(rank) {}
  int group_rank() const override { return rank_; }
  int group_size() const override { return shared_.size; }
  void send_recv_on(const std::vector<Transfer>& batch, mt::WireType type, cudaStream_t s) override {
    const size_t elem = type == mt::WireType::kF32 ? 4 : 2;
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("ring: the stream failed");
    shared_.posted[static_cast<size_t>(rank_)] = batch;
    barrier();
    // The k-th receive from a peer takes the k-th send of that peer to this rank (the order each was posted in).
    std::vector<int> taken(static_cast<size_t>(shared_.size), 0);
    for (const Transfer& t : batch) {
      if (t.send) continue;
      int k = taken[static_cast<size_t>(t.peer)]++;
      const Transfer* match = nullptr;
      for (const Transfer& u : shared_.posted[static_cast<size_t>(t.peer)]) {
        if (u.send && u.peer == rank_ && k-- == 0) {
          match = &u;
          break;
        }
      }
      if (!match || match->n != t.n) throw std::runtime_error("ring: a receive without its matching send");
      if (cudaMemcpy(t.data, match->data, static_cast<size_t>(t.n) * elem, cudaMemcpyDeviceToDevice) != cudaSuccess) {
        throw std::runtime_error("ring: the copy failed");
      }
    }
    // (device-to-device cudaMemcpy returns before the copy ends, on the legacy stream: done before any rank goes on)
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("ring: a copy failed");
    barrier();  // (no sender reuses its buffers before every copy is done)
  }
  void all_reduce_on(void*, int64_t, mt::WireType, mt::ReduceOp, cudaStream_t) override { unused(); }
  void reduce_scatter_on(const void*, void*, int64_t, mt::WireType, cudaStream_t) override { unused(); }
  // recv[r n ..) = rank r's send.
  void all_gather_on(const void* send, void* recv, int64_t n, mt::WireType type, cudaStream_t s) override {
    const size_t bytes = static_cast<size_t>(n) * (type == mt::WireType::kF32 ? 4 : 2);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("all-gather: the stream failed");
    sends_[static_cast<size_t>(rank_)] = send;
    barrier();
    for (int r = 0; r < shared_.size; ++r) {
      if (cudaMemcpy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, sends_[static_cast<size_t>(r)], bytes, cudaMemcpyDeviceToDevice) !=
          cudaSuccess) {
        throw std::runtime_error("all-gather: the copy failed");
      }
    }
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("ring: a copy failed");
    barrier();
  }
  // recv[r n ..) = rank r's send[this rank's n ..).
  void all_to_all_on(const void* send, void* recv, int64_t n, mt::WireType type, cudaStream_t s) override {
    const size_t bytes = static_cast<size_t>(n) * (type == mt::WireType::kF32 ? 4 : 2);
    if (cudaStreamSynchronize(s) != cudaSuccess) throw std::runtime_error("all-to-all: the stream failed");
    sends_[static_cast<size_t>(rank_)] = send;
    barrier();
    for (int r = 0; r < shared_.size; ++r) {
      const char* from = static_cast<const char*>(sends_[static_cast<size_t>(r)]) + static_cast<size_t>(rank_) * bytes;
      if (cudaMemcpy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes, from, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess) {
        throw std::runtime_error("all-to-all: the copy failed");
      }
    }
    if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("ring: a copy failed");
    barrier();
  }
  void all_to_all_v_on(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&, mt::WireType, cudaStream_t) override { unused(); }
  void group_start() override {}
  void group_end() override {}
  std::shared_ptr<StreamCollectives> stream_sub_group(int, int, const std::string&) override {
    unused();
    return nullptr;
  }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("ring: the context-parallel attention uses send / receive, all-to-all and all-gather only"); }
  void barrier() {
    const int64_t gen = shared_.generation;
    if (++shared_.arrived == shared_.size) {
      shared_.arrived = 0;
      ++shared_.generation;
      shared_.cv.notify_all();
    } else {
      shared_.cv.wait(*held, [&] { return shared_.generation != gen || shared_.failed; });
    }
    if (shared_.failed) throw std::runtime_error("ring: another rank failed");
  }
  RingShared& shared_;
  int rank_;
  std::vector<const void*>& sends_ = shared_.sends;
};

mt::Config make_config(const std::string& model, int64_t cp, const std::string& comm, const std::string& extra) {
  std::string flags =
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
      "--lr 1e-3 --vocab-size 250 --attention-dropout 0 --eval-iters 0 --train-iters 1 --seed 11 --bf16 "
      "--mock-data " + extra;
  if (extra.find("--hidden-dropout") == std::string::npos) flags += " --hidden-dropout 0 ";
  if (extra.find("--micro-batch-size") == std::string::npos) flags += " --micro-batch-size 2 --global-batch-size 2 ";
  if (model == "llama") {
    flags += "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2 "
             "--untie-embeddings-and-output-weights --disable-bias-linear ";
  }
  if (model == "llama-recompute") {
    flags += "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2 "
             "--untie-embeddings-and-output-weights --disable-bias-linear --recompute-granularity full --recompute-method uniform "
             "--recompute-num-layers 1 ";
  }
  if (cp > 1) flags += "--context-parallel-size " + std::to_string(cp) + " --cp-comm-type " + comm + " ";
  CLI::App app;
  mt::ConfigCli cli(app);
  app.parse(flags, false);
  mt::Config c = cli.build();
  mt::resolve(c, static_cast<int>(cp));
  return c;
}

struct RankRun {
  mt::ParamStore store;
  std::unique_ptr<mt::CudaGPT> model;
  std::unique_ptr<mt::MicrobatchSlot> slot;
  mt::DeviceMicrobatch dev;
  cudaStream_t stream = nullptr;
  float* acc = nullptr;
};

// One microbatch's forward and backward on `run`, its loss added to run.acc with weight w.
void forward_backward(RankRun& run, float w) {
  run.model->set_final_backward(true);
  run.model->forward(run.dev, w, w, run.acc, 0);
  run.model->backward(run.dev, 0);
  if (cudaStreamSynchronize(run.stream) != cudaSuccess) throw std::runtime_error("the model's stream failed");
}

void prepare(RankRun& run, const mt::Config& cfg, const mt::Microbatch& mb) {
  const mt::ModelLayout where = mt::build_model_layout(cfg, {}, run.store);
  cudaStreamCreateWithFlags(&run.stream, cudaStreamNonBlocking);
  run.model = std::make_unique<mt::CudaGPT>(cfg, run.store, where, run.stream, nullptr, true, nullptr, 1);
  const mt::ModelDims& D = run.model->dims();
  // Hidden dropout: each sample's keys (the embedding's, then per layer the attention block's and the MLP's), as the
  // engine's steps make them; the masks follow the tokens' places in the whole sequence.
  std::vector<uint64_t> keys;
  const auto seed = static_cast<uint64_t>(cfg.training.seed);
  for (int64_t b = 0; cfg.model.hidden_dropout > 0 && b < mb.B; ++b) {
    keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, -1, mt::kDropEmbedding));
    for (int64_t l = 0; l < D.L; ++l) {
      keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, l, mt::kDropAttnOut));
      keys.push_back(mt::dropout_key(seed, 1, mb.first_sample + b, l, mt::kDropMlpOut));
    }
  }
  run.slot = std::make_unique<mt::MicrobatchSlot>(mb.B * mb.S, static_cast<int64_t>(keys.size()));
  run.dev = run.slot->upload(mb, D.learned_pos, 0, D.V_local, D.max_pos, run.stream, [](cudaEvent_t e) { cudaEventSynchronize(e); }, keys);
  cudaMalloc(&run.acc, 4);
  cudaMemsetAsync(run.model->grads(), 0, static_cast<size_t>(run.model->numel()) * 4, run.stream);
  cudaMemsetAsync(run.acc, 0, 4, run.stream);
  cudaStreamSynchronize(run.stream);
}

void release(RankRun& run) {
  run.model.reset();
  cudaFree(run.acc);
  cudaStreamDestroy(run.stream);
}

void test_context_parallel(const std::string& model, int64_t cp, const std::string& comm = "p2p", const std::string& extra = "") {
  char name[200];
  std::snprintf(name, sizeof(name), "context parallelism %s CP %lld %s %s(ranks as threads, one GPU)", model.c_str(), static_cast<long long>(cp),
                comm.c_str(), extra.c_str());
  try {
    const mt::Config whole_cfg = make_config(model, 1, comm, extra), cp_cfg = make_config(model, cp, comm, extra);
    auto data = mt::open_training_data(whole_cfg);
    mt::Microbatch mb = mt::make_microbatch(*data, mt::Split::kTrain, 0, *whole_cfg.training.micro_batch_size, *whole_cfg.data.seq_length, whole_cfg);
    if (whole_cfg.data.reset_attention_mask) {
      // Megatron's mock documents are longer than these sequences: documents of 5 to 60 tokens instead, each token's
      // document start and (--reset-position-ids) its position in its document, as the data loader makes them.
      uint64_t state = 12345;
      for (int64_t b = 0; b < mb.B; ++b) {
        int64_t start = 0;
        for (int64_t s = 0; s < mb.S; ++s) {
          if (s > start && s - start >= 5 + static_cast<int64_t>(state % 56)) {
            start = s;
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          }
          const auto t = static_cast<size_t>(b * mb.S + s);
          mb.row_start[t] = static_cast<int32_t>(start);
          if (whole_cfg.data.reset_position_ids) mb.positions[t] = static_cast<int32_t>(s - start);
        }
      }
    }
    double denom = 0;
    for (float x : mb.loss_mask) denom += x;
    const auto w = static_cast<float>(1.0 / std::max(denom, 1.0));
    // With --reset-attention-mask: the tokens after a document boundary (none would make the check vacuous).
    int64_t in_later_documents = 0;
    for (int32_t x : mb.row_start) in_later_documents += x > 0 ? 1 : 0;
    if (whole_cfg.data.reset_attention_mask && in_later_documents == 0) throw std::runtime_error("the microbatch holds one document per sample");
    // The whole sequences on one model.
    RankRun whole;
    prepare(whole, whole_cfg, mb);
    forward_backward(whole, w);
    const std::vector<float> g_whole = download(whole.model->grads(), static_cast<size_t>(whole.model->numel()));
    const float loss_whole = download(whole.acc, 1)[0];
    // The CP ranks, each with its chunks, the gradients and losses (each a part of the whole sequence's) summed.
    RingShared shared(static_cast<int>(cp));
    std::vector<std::unique_ptr<ThreadRing>> rings;
    std::vector<RankRun> ranks(static_cast<size_t>(cp));
    for (int64_t r = 0; r < cp; ++r) {
      rings.push_back(std::make_unique<ThreadRing>(shared, static_cast<int>(r)));
      prepare(ranks[static_cast<size_t>(r)], cp_cfg, mt::context_parallel_slice(mb, r, cp));
      ranks[static_cast<size_t>(r)].model->set_context_parallel(rings.back().get());
    }
    std::vector<std::string> errors(static_cast<size_t>(cp));
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < cp; ++r) {
      threads.emplace_back([&, r] {
        std::unique_lock<std::mutex> lock(shared.m);
        held = &lock;
        try {
          forward_backward(ranks[static_cast<size_t>(r)], w);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
          shared.failed = true;
          shared.cv.notify_all();
        }
        held = nullptr;
      });
    }
    for (auto& t : threads) t.join();
    for (const std::string& e : errors) {
      if (!e.empty()) throw std::runtime_error(e);
    }
    std::vector<float> g_sum(g_whole.size(), 0.0f);
    float loss_sum = 0;
    for (RankRun& run : ranks) {
      if (run.model->numel() != whole.model->numel()) throw std::logic_error("the CP ranks' layout differs from the whole model's");
      const std::vector<float> g = download(run.model->grads(), g_sum.size());
      for (size_t i = 0; i < g.size(); ++i) g_sum[i] += g[i];
      loss_sum += download(run.acc, 1)[0];
    }
    // Per parameter: the worst relative gap.
    double worst = 0;
    std::string worst_name;
    for (const mt::ParamInfo& p : whole.store.infos()) {
      const std::vector<float> a(g_sum.begin() + p.offset, g_sum.begin() + p.offset + p.numel), b(g_whole.begin() + p.offset, g_whole.begin() + p.offset + p.numel);
      const double e = rel_err(a, b);
      if (e > worst) {
        worst = e;
        worst_name = p.name;
      }
    }
    const double loss_gap = std::fabs(loss_sum - loss_whole) / std::fabs(loss_whole);
    char buf[400];
    std::snprintf(buf, sizeof(buf), "%s: loss %.6f (whole %.6f, %.2e apart); worst parameter gradient %s %.2e from the whole sequence's", name, loss_sum,
                  loss_whole, loss_gap, worst_name.c_str(), worst);
    check(loss_gap < 2e-3 && worst < 3e-2 && std::isfinite(worst), buf);
    for (RankRun& run : ranks) release(run);
    release(whole);
  } catch (const std::exception& e) {
    check(false, std::string(name) + ": " + e.what());
  }
}

}  // namespace

int main() {
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible (%s)\n", mt::gpu_unavailable_reason().c_str());
    return 77;
  }
  test_context_parallel("llama", 2);
  test_context_parallel("llama", 4);
  test_context_parallel("gpt", 2);  // learned positions (the chunks' own), GELU, biases
  test_context_parallel("llama-recompute", 2);  // the ring again in the recompute
  test_context_parallel("llama", 2, "a2a");      // all-to-all between the sequence and the heads (GQA: 4 heads, 2 groups)
  test_context_parallel("gpt", 4, "a2a");
  test_context_parallel("llama-recompute", 2, "a2a");
  // Hidden dropout: the CP ranks draw the whole sequence's masks at their tokens' places (the gradients and losses as
  // the whole model's only if they do).
  test_context_parallel("gpt", 2, "p2p", "--hidden-dropout 0.1 ");
  test_context_parallel("llama-recompute", 4, "p2p", "--hidden-dropout 0.1 ");
  // Documents inside sequences: the ring's blocks each with their document bias (a query whose document starts after
  // every key of a block), and a2a with the gathered document starts and the whole sequences' masks.
  test_context_parallel("llama", 2, "p2p", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("llama-recompute", 4, "p2p", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("gpt", 4, "p2p", "--reset-attention-mask --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("llama", 2, "a2a", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("gpt", 4, "a2a", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
