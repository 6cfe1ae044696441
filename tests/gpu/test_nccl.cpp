// test_nccl.cpp: the NCCL communicator on real GPUs, every collective against values computed on the
// host, uneven blocks included; the unique id over MPI (mpirun) or the TCP rendezvous (torchrun-style
// variables). Exit 77 (skipped, with a message) where no GPU is visible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/cuda/nccl_communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/tcp_communicator.h"
#include "parallel/launcher.h"

using namespace mt;

namespace {

int failures = 0;
void expect(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what);
    ++failures;
  }
}

struct DeviceBuf {
  float* p = nullptr;
  size_t n;
  explicit DeviceBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(float)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  ~DeviceBuf() { cudaFree(p); }
  void put(const std::vector<float>& v) { cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice); }
  std::vector<float> get() const {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
};

bool near(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) > 1e-5f * (1 + std::fabs(b[i]))) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu == 0) {
    std::printf("SKIP: no GPU visible: the NCCL tests run on the GPU machine (scripts/test_gpu.sh)\n");
    return 77;
  }
  const LaunchInfo launch = detect_launch();
  if (launch.kind == LauncherKind::kOpenMpi || launch.kind == LauncherKind::kSlurm) mpi_initialize(&argc, &argv);
  cudaSetDevice(static_cast<int>(launch.local_rank % ngpu));
  const int R = static_cast<int>(launch.rank), W = static_cast<int>(launch.world_size);
  std::shared_ptr<TcpCommunicator> tcp;  // torchrun-style: the unique id goes over the TCP world
  if (launch.kind == LauncherKind::kTorchrun) tcp = make_tcp_world(launch, rendezvous_port(launch), 60);
  auto world = make_nccl_world(launch, 60, tcp.get());
  expect(world->rank() == R && world->size() == W, "world rank and size", R);

  const size_t n = 1000003;  // odd
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = static_cast<float>((i % 97) + R * 0.5);
  DeviceBuf buf(n);
  buf.put(mine);
  world->all_reduce(buf.p, static_cast<int64_t>(n), ReduceOp::kSum);
  std::vector<float> expect_sum(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (int r = 0; r < W; ++r) s += static_cast<double>(i % 97) + r * 0.5;
    expect_sum[i] = static_cast<float>(s);
  }
  expect(near(buf.get(), expect_sum), "all-reduce sum", R);
  buf.put(mine);
  world->all_reduce_async(buf.p, static_cast<int64_t>(n), ReduceOp::kAvg)->wait();
  std::vector<float> expect_avg(n);
  for (size_t i = 0; i < n; ++i) expect_avg[i] = expect_sum[i] / static_cast<float>(W);
  expect(near(buf.get(), expect_avg), "all-reduce avg (async)", R);
  buf.put(mine);
  world->all_reduce(buf.p, static_cast<int64_t>(n), ReduceOp::kMax);
  std::vector<float> expect_max(n);
  for (size_t i = 0; i < n; ++i) expect_max[i] = static_cast<float>((i % 97) + (W - 1) * 0.5);
  expect(near(buf.get(), expect_max), "all-reduce max", R);

  // reduce-scatter / all-gather, even blocks
  const int64_t blk = 4099;
  DeviceBuf full(static_cast<size_t>(blk * W)), part(static_cast<size_t>(blk));
  std::vector<float> f(static_cast<size_t>(blk * W));
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i + R);
  full.put(f);
  world->reduce_scatter(full.p, part.p, blk, ReduceOp::kSum);
  std::vector<float> want(static_cast<size_t>(blk));
  for (int64_t i = 0; i < blk; ++i) want[static_cast<size_t>(i)] = static_cast<float>(W * (R * blk + i) + W * (W - 1) / 2);
  expect(near(part.get(), want), "reduce-scatter", R);
  std::vector<float> p(static_cast<size_t>(blk), static_cast<float>(R + 1));
  part.put(p);
  world->all_gather(part.p, full.p, blk);
  auto g = full.get();
  bool ok = true;
  for (int r = 0; r < W; ++r) ok &= g[static_cast<size_t>(r * blk)] == static_cast<float>(r + 1);
  expect(ok, "all-gather", R);

  // uneven blocks (distributed optimizer buckets)
  std::vector<int64_t> counts;
  int64_t total = 0;
  for (int r = 0; r < W; ++r) {
    counts.push_back(1000 + 7 * r);
    total += counts.back();
  }
  DeviceBuf vfull(static_cast<size_t>(total)), vmine(static_cast<size_t>(counts[static_cast<size_t>(R)]));
  std::vector<float> vf(static_cast<size_t>(total));
  for (size_t i = 0; i < vf.size(); ++i) vf[i] = static_cast<float>(i % 13 + R);
  vfull.put(vf);
  world->reduce_scatter_v_async(vfull.p, vmine.p, counts, ReduceOp::kAvg)->wait();
  int64_t off = 0;
  for (int r = 0; r < R; ++r) off += counts[static_cast<size_t>(r)];
  std::vector<float> vw(static_cast<size_t>(counts[static_cast<size_t>(R)]));
  for (size_t i = 0; i < vw.size(); ++i) vw[i] = static_cast<float>((off + static_cast<int64_t>(i)) % 13) + (W - 1) / 2.0f;
  expect(near(vmine.get(), vw), "reduce-scatter-v avg", R);
  std::vector<float> mineval(vw.size(), static_cast<float>(10 * R));
  vmine.put(mineval);
  world->all_gather_v_async(vmine.p, vfull.p, counts)->wait();
  auto vg = vfull.get();
  ok = true;
  off = 0;
  for (int r = 0; r < W; ++r) {
    ok &= vg[static_cast<size_t>(off)] == static_cast<float>(10 * r) && vg[static_cast<size_t>(off + counts[static_cast<size_t>(r)] - 1)] == static_cast<float>(10 * r);
    off += counts[static_cast<size_t>(r)];
  }
  expect(ok, "all-gather-v", R);

  // The distributed optimizer's in-place blocks (each block summed onto its owner, then every block
  // gathered back): equal blocks (one reduce-scatter / all-gather; small, and large at an offset into the
  // buffer as the trainer's buckets are) and uneven ones (grouped reduces / broadcasts), on ordinary memory
  // and on a symmetric window (from 2 ranks, unless MEGATRAIN_NCCL_WINDOWS=0), fp32 and bf16.
  struct BlockCase {
    int64_t per_rank, step, offset;
    const char* name;
  };
  const BlockCase block_cases[] = {{2048, 0, 0, "equal blocks"}, {1000, 8, 0, "uneven blocks"}, {3000000, 0, 4096, "large equal blocks at an offset"}};
  for (int windowed = 0; windowed < 2; ++windowed) {
    for (const BlockCase& bc : block_cases) {
      for (int bf16 = 0; bf16 < 2; ++bf16) {
        std::vector<int64_t> cs;
        int64_t tot = 0;
        for (int r = 0; r < W; ++r) {
          cs.push_back(bc.per_rank + bc.step * r);
          tot += cs.back();
        }
        const size_t elem = bf16 ? 2 : 4, bytes = static_cast<size_t>(tot) * elem, lead = static_cast<size_t>(bc.offset) * elem;
        void* mem = nullptr;
        if (windowed) {
          mem = world->alloc_window(lead + bytes);
          if (mem == nullptr) continue;  // one rank, or MEGATRAIN_NCCL_WINDOWS=0 (agreed by every rank)
        } else if (cudaMalloc(&mem, lead + bytes) != cudaSuccess) {
          std::fprintf(stderr, "rank %d: cudaMalloc of %zu bytes failed\n", R, lead + bytes);
          std::exit(1);  // the other ranks would wait in the collective: the launcher ends them
        }
        void* data = static_cast<char*>(mem) + lead;
        // Small integers: exact in bf16 and in any summation order.
        std::vector<float> v(static_cast<size_t>(tot));
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13 + R);
        auto put = [&](const std::vector<float>& h) {
          if (!bf16) {
            cudaMemcpy(data, h.data(), bytes, cudaMemcpyHostToDevice);
            return;
          }
          std::vector<uint16_t> b16(h.size());
          for (size_t i = 0; i < h.size(); ++i) {
            uint32_t u = 0;
            std::memcpy(&u, &h[i], 4);
            b16[i] = static_cast<uint16_t>(u >> 16);  // exact for these values
          }
          cudaMemcpy(data, b16.data(), bytes, cudaMemcpyHostToDevice);
        };
        auto get = [&]() {
          std::vector<float> h(static_cast<size_t>(tot));
          if (!bf16) {
            cudaMemcpy(h.data(), data, bytes, cudaMemcpyDeviceToHost);
            return h;
          }
          std::vector<uint16_t> b16(h.size());
          cudaMemcpy(b16.data(), data, bytes, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < h.size(); ++i) {
            const uint32_t u = static_cast<uint32_t>(b16[i]) << 16;
            std::memcpy(&h[i], &u, 4);
          }
          return h;
        };
        const WireType wt = bf16 ? WireType::kBF16 : WireType::kF32;
        const std::string how = std::string(windowed ? "a window, " : "ordinary memory, ") + bc.name + (bf16 ? ", bf16" : ", fp32");
        put(v);
        cudaDeviceSynchronize();
        world->reduce_scatter_v_after(data, cs, wt, ReduceOp::kSum, nullptr);
        world->wait_stream("test reduce onto owners");
        int64_t lo = 0;
        for (int r = 0; r < R; ++r) lo += cs[static_cast<size_t>(r)];
        auto h = get();
        ok = true;
        for (int64_t i = lo; i < lo + cs[static_cast<size_t>(R)]; ++i) ok &= h[static_cast<size_t>(i)] == static_cast<float>(W * (i % 13) + W * (W - 1) / 2);
        expect(ok, ("in-place reduce onto owners, " + how).c_str(), R);
        for (int64_t i = lo; i < lo + cs[static_cast<size_t>(R)]; ++i) h[static_cast<size_t>(i)] = static_cast<float>(10 * R + i % 5);
        put(h);
        cudaDeviceSynchronize();
        world->all_gather_v_on(data, cs, wt, world->stream());
        world->wait_stream("test gather");
        h = get();
        ok = true;
        int64_t off2 = 0;
        for (int r = 0; r < W; off2 += cs[static_cast<size_t>(r)], ++r) {
          for (int64_t i = off2; i < off2 + cs[static_cast<size_t>(r)]; ++i) ok &= h[static_cast<size_t>(i)] == static_cast<float>(10 * r + i % 5);
        }
        expect(ok, ("in-place gather, " + how).c_str(), R);
        if (!windowed) cudaFree(mem);  // a window goes with the communicator
      }
    }
  }

  // The all-to-all on the stream (the split TP layers' partial sums under SP: bf16 on a window, copy engines
  // under the zero-CTA policy), and in fp32 on ordinary memory. Element e of block j of rank R's send:
  // R * 8 + j + e % 3 (small integers, exact in bf16); rank R's block r must come from rank r's block R.
  for (int windowed = 0; windowed < 2; ++windowed) {
    const int64_t n = 4096;
    const bool b16 = windowed == 1;
    const size_t elem = b16 ? 2 : 4, bytes = static_cast<size_t>(n * W) * elem;
    char* mem = nullptr;
    if (windowed) {
      mem = static_cast<char*>(world->alloc_window(2 * bytes));
      if (mem == nullptr) continue;
    } else if (cudaMalloc(&mem, 2 * bytes) != cudaSuccess) {
      std::fprintf(stderr, "rank %d: cudaMalloc of %zu bytes failed\n", R, 2 * bytes);
      std::exit(1);
    }
    std::vector<float> v(static_cast<size_t>(n * W));
    for (int64_t i = 0; i < n * W; ++i) v[static_cast<size_t>(i)] = static_cast<float>(R * 8 + i / n + i % n % 3);
    std::vector<uint16_t> h16(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u = 0;
      std::memcpy(&u, &v[i], 4);
      h16[i] = static_cast<uint16_t>(u >> 16);
    }
    cudaMemcpy(mem, b16 ? static_cast<const void*>(h16.data()) : static_cast<const void*>(v.data()), bytes, cudaMemcpyHostToDevice);
    world->all_to_all_on(mem, mem + bytes, n, b16 ? WireType::kBF16 : WireType::kF32, world->stream());
    world->wait_stream("test all-to-all");
    std::vector<float> got(v.size());
    if (b16) {
      cudaMemcpy(h16.data(), mem + bytes, bytes, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < got.size(); ++i) {
        const uint32_t u = static_cast<uint32_t>(h16[i]) << 16;
        std::memcpy(&got[i], &u, 4);
      }
    } else {
      cudaMemcpy(got.data(), mem + bytes, bytes, cudaMemcpyDeviceToHost);
    }
    ok = true;
    for (int64_t i = 0; i < n * W; ++i) ok &= got[static_cast<size_t>(i)] == static_cast<float>(i / n * 8 + R + i % n % 3);
    expect(ok, windowed ? "all-to-all on the stream, a window, bf16" : "all-to-all on the stream, ordinary memory, fp32", R);
    if (!windowed) cudaFree(mem);
  }

  // Batched send / receive (the pipeline's boundary transfers): a ring in both directions with uneven sizes,
  // through the host interface and on the stream in bf16; and the all-to-all with per-rank counts (expert
  // dispatch), zero counts included. Values name sender, receiver and position (small integers: exact).
  {
    const int next = (R + 1) % W, prev = (R + W - 1) % W;
    auto tagv = [](int from, int to, int64_t i) { return static_cast<float>(from * 16 + to * 4 + i % 3); };
    auto n_of = [](int from) { return int64_t{1000} + 7 * from; };
    DeviceBuf to_next(static_cast<size_t>(n_of(R))), from_prev(static_cast<size_t>(n_of(prev)));
    std::vector<float> h(static_cast<size_t>(n_of(R)));
    for (int64_t i = 0; i < n_of(R); ++i) h[static_cast<size_t>(i)] = tagv(R, next, i);
    to_next.put(h);
    world->send_recv_batch_async({P2POp::send(to_next.p, n_of(R), next), P2POp::recv(from_prev.p, n_of(prev), prev)})->wait();
    auto got = from_prev.get();
    ok = true;
    for (int64_t i = 0; i < n_of(prev); ++i) ok &= got[static_cast<size_t>(i)] == tagv(prev, R, i);
    expect(ok, "batched send / receive ring (host interface)", R);
    // bf16 on the stream: rank R sends 2048 elements both ways.
    const int64_t m = 2048;
    uint16_t* dev = nullptr;
    cudaMalloc(&dev, static_cast<size_t>(4 * m) * 2);
    std::vector<uint16_t> out16(static_cast<size_t>(2 * m));
    auto bf = [](float f) {
      uint32_t u = 0;
      std::memcpy(&u, &f, 4);
      return static_cast<uint16_t>(u >> 16);
    };
    for (int64_t i = 0; i < m; ++i) {
      out16[static_cast<size_t>(i)] = bf(tagv(R, next, i));
      out16[static_cast<size_t>(m + i)] = bf(tagv(R, prev, i));
    }
    cudaMemcpy(dev, out16.data(), out16.size() * 2, cudaMemcpyHostToDevice);
    world->send_recv_on({{true, dev, m, next}, {true, dev + m, m, prev}, {false, dev + 2 * m, m, prev}, {false, dev + 3 * m, m, next}}, WireType::kBF16,
                        world->stream());
    world->wait_stream("test send / receive on the stream");
    std::vector<uint16_t> in16(static_cast<size_t>(2 * m));
    cudaMemcpy(in16.data(), dev + 2 * m, in16.size() * 2, cudaMemcpyDeviceToHost);
    ok = true;
    for (int64_t i = 0; i < m; ++i) ok &= in16[static_cast<size_t>(i)] == bf(tagv(prev, R, i)) && in16[static_cast<size_t>(m + i)] == bf(tagv(next, R, i));
    expect(ok, "send / receive batch on the stream, both directions, bf16", R);
    cudaFree(dev);
    auto count = [](int from, int to) { return (from + 2 * to) % 3 == 0 ? int64_t{0} : 100 + from + 4 * int64_t{to}; };
    std::vector<int64_t> sc, rc;
    std::vector<float> sh;
    int64_t rtotal = 0;
    for (int to = 0; to < W; ++to) {
      sc.push_back(count(R, to));
      rc.push_back(count(to, R));
      rtotal += rc.back();
      for (int64_t i = 0; i < sc.back(); ++i) sh.push_back(tagv(R, to, i));
    }
    DeviceBuf sd(sh.size()), rd(static_cast<size_t>(rtotal));
    sd.put(sh);
    world->all_to_all_v(sd.p, sc, rd.p, rc);
    got = rd.get();
    ok = true;
    size_t at = 0;
    for (int from = 0; from < W; ++from) {
      for (int64_t i = 0; i < rc[static_cast<size_t>(from)]; ++i) ok &= got[at++] == tagv(from, R, i);
    }
    expect(ok, "all-to-all with per-rank counts", R);
  }

  // broadcast, barrier, double all-reduce, split into a group per rank parity
  DeviceBuf b(16);
  b.put(std::vector<float>(16, static_cast<float>(R == 0 ? 42 : -1)));
  world->broadcast(b.p, 16 * sizeof(float), 0);
  expect(b.get()[15] == 42.0f, "broadcast", R);
  world->barrier();
  double* d = nullptr;
  cudaMalloc(&d, sizeof(double));
  const double one = 1.0;
  cudaMemcpy(d, &one, sizeof(double), cudaMemcpyHostToDevice);
  world->all_reduce(d, 1, ReduceOp::kSum);
  double back = 0;
  cudaMemcpy(&back, d, sizeof(double), cudaMemcpyDeviceToHost);
  cudaFree(d);
  expect(back == static_cast<double>(W), "double all-reduce", R);
  auto sub = world->split(R % 2, R, "parity");
  expect(sub && sub->size() == (W + 1 - R % 2) / 2, "split", R);

  std::printf("rank %d of %d (%s, GPU %d): %s\n", R, W, launcher_name(launch.kind), static_cast<int>(launch.local_rank % ngpu),
              failures ? "FAIL" : "all NCCL collectives correct");
  sub.reset();
  world.reset();
  mpi_finalize();
  return failures ? 1 : 0;
}
