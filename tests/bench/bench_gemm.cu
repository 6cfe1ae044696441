// bench_gemm.cu: TFLOP/s of megatrain's cuBLASLt GEMM wrapper on random bf16 inputs (fp32 accumulate,
// fp32 output), median of timed repeats with CUDA events, after warm-up. The ceiling every matrix-bound
// kernel of the CUDA engine is measured against.
// Usage: bench_gemm [M N K] (default 8192 8192 8192)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/cuda/gemm_lt.h"
#include "tensor/cuda/cuda_check.h"

namespace {
__global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned x = static_cast<unsigned>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = __float2bfloat16((static_cast<float>(x & 0xffff) / 65536.0f - 0.5f));
  }
}
}  // namespace

int main(int argc, char** argv) {
  const int64_t M = argc > 3 ? std::atoll(argv[1]) : 8192, N = argc > 3 ? std::atoll(argv[2]) : 8192,
                K = argc > 3 ? std::atoll(argv[3]) : 8192;
  __nv_bfloat16 *A, *B;
  float* C;
  MT_CUDA_CHECK(cudaMalloc(&A, M * K * sizeof(__nv_bfloat16)));
  MT_CUDA_CHECK(cudaMalloc(&B, K * N * sizeof(__nv_bfloat16)));
  MT_CUDA_CHECK(cudaMalloc(&C, M * N * sizeof(float)));
  fill_random<<<1024, 256>>>(A, static_cast<size_t>(M * K), 1);
  fill_random<<<1024, 256>>>(B, static_cast<size_t>(K * N), 2);
  MT_CUDA_CHECK_LAUNCH();
  auto& g = mt::cuda::GemmLt::instance();
  auto run = [&] { g.gemm(false, true, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N, CUDA_R_16BF, nullptr); };  // x W^T, as the linear layers
  for (int i = 0; i < 5; ++i) run();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 20; ++r) {
    cudaEventRecord(e0);
    run();
    cudaEventRecord(e1);
    MT_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double med = ms[ms.size() / 2];
  std::printf("bf16 GEMM %lldx%lldx%lld (A x B^T, fp32 out): median %.3f ms = %.1f TFLOP/s (min %.3f ms, max %.3f ms)\n",
              static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), med, 2.0 * M * N * K / (med * 1e-3) / 1e12,
              ms.front(), ms.back());
  return 0;
}
