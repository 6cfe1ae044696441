// bench_overlap.cu: does the optimizer's bandwidth-bound AdamW pass hide behind compute-bound GEMMs when the two run
// on separate streams? The premise of overlapping the step's update with the next forward (docs/PERF.md). Times, with
// CUDA events: the GEMMs alone, AdamW alone, then both launched together (AdamW on a lower-priority stream, then on an
// equal one, then split into one piece per GEMM group as a layer-by-layer update would run).
// Usage: bench_overlap [params (millions, default 2000)] [gemms (default 48)] [M N K (default 16384 8192 2048)]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/optimizer_step.h"
#include "tensor/cuda/cuda_check.h"

namespace {
__global__ void fill(__nv_bfloat16* p, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) & 0xff) / 256.0f - 0.5f);
  }
}
__global__ void fill_f(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) p[i] = v;
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t P = (argc > 1 ? std::atoll(argv[1]) : 2000) * 1000000LL;
  const int gemms = argc > 2 ? std::atoi(argv[2]) : 48;
  const int64_t M = argc > 5 ? std::atoll(argv[3]) : 16384, N = argc > 5 ? std::atoll(argv[4]) : 8192, K = argc > 5 ? std::atoll(argv[5]) : 2048;
  __nv_bfloat16 *A, *B, *C, *w16;
  float *w, *m, *v, *g;
  MT_CUDA_CHECK(cudaMalloc(&A, M * K * 2));
  MT_CUDA_CHECK(cudaMalloc(&B, N * K * 2));
  MT_CUDA_CHECK(cudaMalloc(&C, M * N * 2));
  MT_CUDA_CHECK(cudaMalloc(&w16, P * 2));
  MT_CUDA_CHECK(cudaMalloc(&w, P * 4));
  MT_CUDA_CHECK(cudaMalloc(&m, P * 4));
  MT_CUDA_CHECK(cudaMalloc(&v, P * 4));
  MT_CUDA_CHECK(cudaMalloc(&g, P * 4));
  fill<<<1024, 256>>>(A, static_cast<size_t>(M * K));
  fill<<<1024, 256>>>(B, static_cast<size_t>(N * K));
  fill_f<<<4096, 256>>>(w, static_cast<size_t>(P), 0.5f);
  fill_f<<<4096, 256>>>(g, static_cast<size_t>(P), 1e-3f);
  MT_CUDA_CHECK(cudaMemset(m, 0, P * 4));
  MT_CUDA_CHECK(cudaMemset(v, 0, P * 4));
  std::vector<mt::cuda::AdamChunk> chunks;
  for (int64_t o = 0; o < P; o += 65536) chunks.push_back({o, static_cast<int32_t>(std::min<int64_t>(65536, P - o)), 1});
  mt::cuda::AdamChunk* d_chunks;
  MT_CUDA_CHECK(cudaMalloc(&d_chunks, chunks.size() * sizeof(mt::cuda::AdamChunk)));
  MT_CUDA_CHECK(cudaMemcpy(d_chunks, chunks.data(), chunks.size() * sizeof(mt::cuda::AdamChunk), cudaMemcpyHostToDevice));
  mt::cuda::StepState st{};
  st.clip_coef = 1;
  st.t = 1;
  st.bc1 = 0.1f;
  st.bc2 = 0.001f;
  st.unscale = 1;
  mt::cuda::StepState* d_st;
  MT_CUDA_CHECK(cudaMalloc(&d_st, sizeof st));
  MT_CUDA_CHECK(cudaMemcpy(d_st, &st, sizeof st, cudaMemcpyHostToDevice));
  int lo_prio = 0, hi_prio = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo_prio, &hi_prio));
  cudaStream_t s_gemm, s_opt_low, s_opt_equal;
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_gemm, cudaStreamNonBlocking, hi_prio));
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_opt_low, cudaStreamNonBlocking, lo_prio));
  MT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_opt_equal, cudaStreamNonBlocking, hi_prio));
  auto& lt = mt::cuda::GemmLt::instance();
  auto run_gemms = [&](int first, int count) {
    for (int i = first; i < first + count; ++i) lt.gemm_ex(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, CUDA_R_16BF, CUDA_R_16BF, nullptr, s_gemm);
  };
  auto adam = [&](int64_t first, int64_t count, cudaStream_t s) {
    mt::cuda::adamw_multi({.w = w, .m = m, .v = v, .w16 = w16, .g = g, .chunks = d_chunks + first, .count = count, .state = d_st, .lr = 1e-4f,
                           .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f}, s);
  };
  const auto nch = static_cast<int64_t>(chunks.size());
  cudaEvent_t start, gemm_done, opt_done;
  MT_CUDA_CHECK(cudaEventCreate(&start));
  MT_CUDA_CHECK(cudaEventCreate(&gemm_done));
  MT_CUDA_CHECK(cudaEventCreate(&opt_done));
  // One case: the GEMMs and/or AdamW from a common start; the time until both are done.
  auto measure = [&](const char* name, bool with_gemms, bool with_adam, cudaStream_t s_opt, int pieces) {
    std::vector<float> times;
    for (int r = 0; r < 5; ++r) {
      MT_CUDA_CHECK(cudaDeviceSynchronize());
      cudaEventRecord(start, s_gemm);
      cudaStreamWaitEvent(s_opt, start, 0);
      if (with_adam && pieces <= 1) adam(0, nch, s_opt);
      if (with_gemms && pieces <= 1) run_gemms(0, gemms);
      if (pieces > 1) {  // AdamW piece i beside GEMM group i (a layer's update beside the previous layer's forward)
        for (int i = 0; i < pieces; ++i) {
          const int64_t a = nch * i / pieces, b = nch * (i + 1) / pieces;
          adam(a, b - a, s_opt);
          run_gemms(gemms * i / pieces, gemms * (i + 1) / pieces - gemms * i / pieces);
        }
      }
      cudaEventRecord(opt_done, s_opt);
      cudaStreamWaitEvent(s_gemm, opt_done, 0);
      cudaEventRecord(gemm_done, s_gemm);
      MT_CUDA_CHECK(cudaEventSynchronize(gemm_done));
      float t = 0;
      cudaEventElapsedTime(&t, start, gemm_done);
      times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    std::printf("%-44s median %8.2f ms (min %8.2f)\n", name, times[times.size() / 2], times.front());
    return times[times.size() / 2];
  };
  run_gemms(0, 4);
  adam(0, nch, s_gemm);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("GEMMs: %d of %lldx%lldx%lld bf16 (%.2f TFLOP); AdamW over %.0f M parameters (%.1f GB moved)\n", gemms, static_cast<long long>(M),
              static_cast<long long>(N), static_cast<long long>(K), 2.0 * M * N * K * gemms / 1e12, P / 1e6, P * 30.0 / 1e9);
  const float tg = measure("GEMMs alone", true, false, s_opt_low, 1);
  const float ta = measure("AdamW alone", false, true, s_opt_low, 1);
  const float t1 = measure("both, AdamW on a low-priority stream", true, true, s_opt_low, 1);
  const float t2 = measure("both, equal priorities", true, true, s_opt_equal, 1);
  const float t3 = measure("both, AdamW in 16 pieces, low priority", true, true, s_opt_low, 16);
  std::printf("hidden share of AdamW (1 - (both - GEMMs) / AdamW): low %.2f, equal %.2f, pieces %.2f\n", 1 - (t1 - tg) / ta, 1 - (t2 - tg) / ta,
              1 - (t3 - tg) / ta);
  return 0;
}
