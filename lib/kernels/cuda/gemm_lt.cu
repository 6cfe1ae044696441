// gemm_lt.cu: a row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so cuBLASLt gets
// B as its first operand and A as its second.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "kernels/cuda/gemm_lt.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt::cuda {

GemmLt& GemmLt::instance() {
  static GemmLt* g = new GemmLt();
  return *g;
}

namespace {
size_t element_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 1; }
}  // namespace

GemmLt::GemmLt() {
  MT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  const char* tune = std::getenv("MEGATRAIN_GEMM_AUTOTUNE");
  tune_ = tune == nullptr || std::string(tune) != "0";  // on unless MEGATRAIN_GEMM_AUTOTUNE=0
}

void GemmLt::tune_plan(Plan& plan, const void* A, const void* B, void* C, float beta, size_t c_bytes, cudaStream_t stream) {
  // A GEMM that accumulates into C (a weight gradient into its fp32 main gradient) is timed on a copy's worth of C kept
  // aside and restored after the runs: each run adds to C. Where that copy does not fit, the heuristic's first stays.
  // (Stream-ordered allocation: cudaFree would wait for the whole device, other streams' collectives included.)
  void* kept = nullptr;
  if (beta != 0.0f) {
    if (cudaMallocAsync(&kept, c_bytes, stream) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    MT_CUDA_CHECK(cudaMemcpyAsync(kept, C, c_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  tune_candidates(plan, A, B, C, beta, stream);
  if (kept) {
    MT_CUDA_CHECK(cudaMemcpyAsync(C, kept, c_bytes, cudaMemcpyDeviceToDevice, stream));
    MT_CUDA_CHECK(cudaFreeAsync(kept, stream));
  }
}

void GemmLt::tune_candidates(Plan& plan, const void* A, const void* B, void* C, float beta, cudaStream_t stream) {
  cublasLtMatmulPreference_t pref;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                       sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int found = 0;
  MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, kTuneCandidates, results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found <= 1) return;
  cudaEvent_t start = nullptr, stop = nullptr;
  MT_CUDA_CHECK(cudaEventCreate(&start));
  MT_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f;
  void* ws = workspace_locked(stream);
  float best_ms = 0.0f;
  int best = -1;
  for (int i = 0; i < found; ++i) {
    const auto run = [&] {
      return cublasLtMatmul(handle_, plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c, &results[i].algo, ws, workspace_bytes_, stream);
    };
    if (results[i].state != CUBLAS_STATUS_SUCCESS || run() != CUBLAS_STATUS_SUCCESS) continue;  // (a warm-up run)
    float ms = 0.0f;
    for (int rep = 0; rep < 3; ++rep) {  // the fastest of three runs
      MT_CUDA_CHECK(cudaEventRecord(start, stream));
      MT_CUBLAS_CHECK(run());
      MT_CUDA_CHECK(cudaEventRecord(stop, stream));
      MT_CUDA_CHECK(cudaEventSynchronize(stop));
      float t = 0.0f;
      MT_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
      ms = rep == 0 ? t : std::min(ms, t);
    }
    if (best < 0 || ms < best_ms) {
      best = i;
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (best >= 0) plan.algo = results[best].algo;
}

void* GemmLt::workspace(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  return workspace_locked(stream);
}

void* GemmLt::workspace_locked(cudaStream_t stream) {
  void*& w = workspaces_[stream];
  if (!w) w = DeviceAllocator::instance().allocate(workspace_bytes_);
  return w;
}

void GemmLt::release_workspace(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workspaces_.find(stream);
  if (it == workspaces_.end()) return;
  DeviceAllocator::instance().release(it->second);
  workspaces_.erase(it);
}

void GemmLt::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
                  int64_t ldb, float beta, float* C, int64_t ldc, cudaDataType_t ab, cudaStream_t stream) {
  gemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab, CUDA_R_32F, nullptr, stream);
}

GemmLt::Plan* GemmLt::create_plan(const Key& key, const void* bias, const GemmEpilogue& ep, bool required) {
  const auto& [ta, tb, M, N, K, lda, ldb, ldc, ab_i, c_i, has_bias, kind, ld_aux, varying, accumulates] = key;
  const auto ab = static_cast<cudaDataType_t>(ab_i), c_type = static_cast<cudaDataType_t>(c_i);
  const bool gelu = ep.kind == GemmEpilogue::kGeluAux || ep.kind == GemmEpilogue::kDGelu;
  Plan p{};
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major view: first operand = B (op = tb), second = A (op = ta); m = N, n = M.
  const cublasOperation_t op1 = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
  cublasLtEpilogue_t epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (ep.kind == GemmEpilogue::kGeluAux) epi = has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (ep.kind == GemmEpilogue::kDGelu) epi = CUBLASLT_EPILOGUE_DGELU;
  if (ep.kind == GemmEpilogue::kBiasGrad) epi = CUBLASLT_EPILOGUE_BGRADB;  // the column-major view's B is our A
  if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  if (has_bias) {
    const void* dummy = bias;  // the pointer is set per call; the heuristic only needs one present
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dummy, sizeof(dummy)));
  }
  if (ep.kind == GemmEpilogue::kBiasGrad) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.aux, sizeof(ep.aux)));
  }
  if (gelu) {
    // Column-major view: aux is D's shape (N rows, M columns) with leading dimension ld_aux, of D's type.
    const void* aux = ep.aux;
    const int64_t ld = ep.ld_aux;
    const auto aux_type = static_cast<int32_t>(c_type);
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }
  const uint64_t m = static_cast<uint64_t>(N), n = static_cast<uint64_t>(M), k = static_cast<uint64_t>(K);
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, tb ? k : m, tb ? m : k, ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, ta ? n : k, ta ? k : n, lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_type, m, n, ldc));
  cublasLtMatmulPreference_t pref;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                       sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    if (!required) return nullptr;
    throw std::runtime_error("cuBLASLt has no algorithm for a " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " GEMM" +
                             (ep.kind != GemmEpilogue::kNone ? " with this epilogue" : ""));
  }
  p.algo = result.algo;
  return &plans_.emplace(key, p).first->second;
}

bool GemmLt::has_algorithm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t ab,
                           cudaDataType_t c_type, const GemmEpilogue& ep) {
  const Key key{ta, tb, M, N, K, lda, ldb, ldc, static_cast<int>(ab), static_cast<int>(c_type), false, static_cast<int>(ep.kind), ep.ld_aux, false, false};
  GemmEpilogue probe = ep;  // the heuristic needs the output pointers present, not valid: each call sets its own
  if (probe.aux == nullptr) probe.aux = reinterpret_cast<void*>(std::uintptr_t{256});
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count(key) != 0 || create_plan(key, nullptr, probe, false) != nullptr;
}

void GemmLt::gemm_ex(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
                     int64_t ldb, float beta, void* C, int64_t ldc, cudaDataType_t ab, cudaDataType_t c_type, const void* bias,
                     cudaStream_t stream, const GemmEpilogue& ep, bool varying) {
  if (M == 0 || N == 0) return;
  const bool has_bias = bias != nullptr;
  const bool gelu = ep.kind == GemmEpilogue::kGeluAux || ep.kind == GemmEpilogue::kDGelu;
  if (gelu && (ep.aux == nullptr || ep.ld_aux % 8 != 0 || ep.ld_aux < N)) {
    throw std::logic_error("GEMM epilogue: the GELU auxiliary matrix needs a pointer and a leading dimension >= N, divisible by 8");
  }
  if (ep.kind == GemmEpilogue::kBiasGrad && (ep.aux == nullptr || c_type != CUDA_R_32F)) {
    throw std::logic_error("GEMM epilogue: the bias gradient needs an fp32 output vector (and an fp32 C)");
  }
  if ((ep.kind == GemmEpilogue::kDGelu || ep.kind == GemmEpilogue::kBiasGrad) && has_bias) {
    throw std::logic_error("GEMM epilogue: no bias input with a backward epilogue");
  }
  // A varying GEMM's plan is the one of its bucket's sizes, each where the leading dimensions hold it (in the
  // column-major view the first operand has K rows when tb, the second M rows when ta, else K).
  int64_t plan_M = M, plan_K = K;
  if (varying) {
    if (!ta || varying_bucket(M) <= lda) plan_M = varying_bucket(M);
    if ((!tb || varying_bucket(K) <= ldb) && (ta || varying_bucket(K) <= lda)) plan_K = varying_bucket(K);
  }
  const Key key{ta, tb, plan_M, N, plan_K, lda, ldb, ldc, static_cast<int>(ab), static_cast<int>(c_type), has_bias, static_cast<int>(ep.kind), ep.ld_aux,
                varying, beta != 0.0f};
  Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    plan = it != plans_.end() ? &it->second : create_plan(key, bias, ep, true);
    if (varying) {  // this call's sizes (column-major view: m = N, n = M)
      const auto set = [](cublasLtMatrixLayout_t l, int64_t rows, int64_t cols) {
        const auto r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
        MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
        MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
      };
      set(plan->a, tb ? K : N, tb ? N : K);
      set(plan->b, ta ? M : K, ta ? K : M);
      set(plan->c, N, M);
    }
    if (has_bias) {
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (gelu) MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof(ep.aux)));
    if (ep.kind == GemmEpilogue::kBiasGrad) {
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.aux, sizeof(ep.aux)));
    }
    if (it == plans_.end() && tune_ && !varying) tune_plan(*plan, A, B, C, beta, static_cast<size_t>(M) * ldc * element_bytes(c_type), stream);
    // (launched under the lock: the pointers and sizes just set are this call's until it is queued)
    const cublasStatus_t status = cublasLtMatmul(handle_, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C, plan->c, C, plan->c, &plan->algo,
                                                 workspace_locked(stream), workspace_bytes_, stream);
    if (status == CUBLAS_STATUS_SUCCESS || !(varying && (plan_M != M || plan_K != K))) {
      MT_CUBLAS_CHECK(status);
      return;
    }
  }
  // The bucket's algorithm refused these sizes (cuBLASLt checks an algorithm against each call's problem): a plan of
  // their own, as a GEMM that does not vary gets (the refused call queued nothing).
  gemm_ex(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ab, c_type, bias, stream, ep, false);
}

void GemmLt::gemm_fp8(int64_t M, int64_t N, int64_t K, float alpha, const void* A, cudaDataType_t a_type, const float* a_scale, const void* B,
                      cudaDataType_t b_type, const float* b_scale, float beta, void* C, int64_t ldc, cudaDataType_t c_type, const void* bias,
                      bool fast_accum, cudaStream_t stream, ScaleMode a_mode, ScaleMode b_mode, bool varying) {
  if (M == 0 || N == 0) return;
  if (K % 16 != 0 || N % 16 != 0 || M % 16 != 0) {
    throw std::logic_error("FP8 GEMM " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + ": every dimension must be a multiple of 16");
  }
  const bool blocks = a_mode != ScaleMode::kTensor || b_mode != ScaleMode::kTensor;
  if (blocks && (fast_accum || (a_mode == ScaleMode::kBlock128 && b_mode == ScaleMode::kBlock128) || a_mode == ScaleMode::kTensor ||
                 b_mode == ScaleMode::kTensor)) {
    throw std::logic_error("FP8 GEMM with block scales: both operands in blocks, not both 128 x 128, and no fast accumulation");
  }
  const int64_t plan_M = varying ? varying_bucket(M) : M, plan_K = varying ? varying_bucket(K) : K;
  const Fp8Key key{plan_M, N, plan_K, ldc, static_cast<int>(a_type), static_cast<int>(b_type), static_cast<int>(c_type), bias != nullptr, fast_accum,
                   static_cast<int>(a_mode), static_cast<int>(b_mode), varying, beta != 0.0f};
  std::unique_lock<std::mutex> lock(mu_);
  auto it = fp8_plans_.find(key);
  const bool new_plan = it == fp8_plans_.end();
  if (new_plan) {
    Plan p{};
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Column-major view: C^T [N, M] = B [K, N]^T (first operand, transposed) x A^T [K, M] (second, as is): "TN".
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    const int8_t fast = fast_accum ? 1 : 0;
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    if (blocks) {  // cuBLASLt's A is our B
#if CUBLAS_VERSION >= 120900
      if (cublasLtGetVersion() < 120900) throw std::runtime_error("FP8 GEMMs with block scales need cuBLAS 12.9 or newer at run time");
      const auto mode = [](ScaleMode m) {
        return static_cast<int32_t>(m == ScaleMode::kVec128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
      };
      const int32_t lt_a = mode(b_mode), lt_b = mode(a_mode);
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &lt_a, sizeof(lt_a)));
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &lt_b, sizeof(lt_b)));
#else
      throw std::runtime_error("FP8 GEMMs with block scales need cuBLAS 12.9 or newer: this build's cuBLAS is older");
#endif
    }
    const void* dummy = reinterpret_cast<const void*>(std::uintptr_t{256});  // set per call; the heuristic needs them present
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof(dummy)));
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof(dummy)));
    if (bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      const auto bias_type = static_cast<int32_t>(c_type);
      MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    const auto m = static_cast<uint64_t>(N), n = static_cast<uint64_t>(plan_M), k = static_cast<uint64_t>(plan_K);
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, b_type, k, m, static_cast<int64_t>(k)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, a_type, k, n, static_cast<int64_t>(k)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_type, m, n, ldc));
    cublasLtMatmulPreference_t pref;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    MT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) {
      throw std::runtime_error("cuBLASLt has no FP8 algorithm for a " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                               (blocks ? " GEMM with block scales on this GPU (they need Hopper, compute capability 9.0, and cuBLAS 12.9 or newer)"
                                       : " GEMM on this GPU (FP8 needs compute capability 8.9 or newer)"));
    }
    p.algo = result.algo;
    it = fp8_plans_.emplace(key, p).first;
  }
  Plan& plan = it->second;
  // cuBLASLt's A is our B: its scale is b_scale.
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  if (bias) MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (new_plan && tune_ && !varying) tune_plan(plan, A, B, C, beta, static_cast<size_t>(M) * ldc * element_bytes(c_type), stream);
  if (varying) {  // this call's sizes: cuBLASLt's A [K, N] and B [K, M], both with leading dimension K, C [N, M]
    const auto set = [](cublasLtMatrixLayout_t l, int64_t rows, int64_t cols, int64_t ld) {
      const auto r = static_cast<uint64_t>(rows), c = static_cast<uint64_t>(cols);
      MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ROWS, &r, sizeof(r)));
      MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_COLS, &c, sizeof(c)));
      MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld)));
    };
    set(plan.a, K, N, K);
    set(plan.b, K, M, K);
    set(plan.c, N, M, ldc);
  }
  const cublasStatus_t status = cublasLtMatmul(handle_, plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C, plan.c, &plan.algo,
                                               workspace_locked(stream), workspace_bytes_, stream);
  if (status == CUBLAS_STATUS_SUCCESS || !(varying && (plan_M != M || plan_K != K))) {
    MT_CUBLAS_CHECK(status);
    return;
  }
  // The bucket's algorithm refused these sizes: a plan of their own (the refused call queued nothing).
  lock.unlock();
  gemm_fp8(M, N, K, alpha, A, a_type, a_scale, B, b_type, b_scale, beta, C, ldc, c_type, bias, fast_accum, stream, a_mode, b_mode, false);
}

}  // namespace mt::cuda
