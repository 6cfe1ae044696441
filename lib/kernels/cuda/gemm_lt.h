// gemm_lt.h (CUDA): row-major GEMM through cuBLASLt, fp32 accumulation, fp32 or bf16 inputs, the
// algorithm chosen by cuBLASLt's heuristic once per shape (a varying GEMM's: per bucket of shapes) and cached.
// Same argument order as kernels/cpu/linear.h's gemm().
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace mt::cuda {

// Optional fused epilogues on a GEMM's output D (in the row-major view, D[M,N], aux the same shape with
// leading dimension ld_aux, of D's type):
//   kGeluAux:  D = gelu(A op B + bias) (tanh form, as kernels/cpu/activation), aux = the GELU's input
//   kDGelu:    D = (A op B) * gelu'(aux) (the GELU backward folded into the data-gradient GEMM)
//   kBiasGrad: D as usual, and aux[m] = sum over k of op(A)[m, k] (M values of D's type, written, not added):
//              in a weight-gradient GEMM dW = dY^T X (A = dY, transposed) the bias gradient, from the same
//              read of dY (cuBLASLt's BGRADB, its B being our A); ld_aux unused
struct GemmEpilogue {
  enum Kind { kNone, kGeluAux, kDGelu, kBiasGrad } kind = kNone;
  void* aux = nullptr;
  int64_t ld_aux = 0;
};

class GemmLt {
 public:
  static GemmLt& instance();
  // C[M,N] = alpha * op(A) op(B) + beta * C, row-major, C fp32; A/B are `ab` (CUDA_R_32F or CUDA_R_16BF).
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
            int64_t ldb, float beta, float* C, int64_t ldc, cudaDataType_t ab, cudaStream_t stream);
  // The general form: C of type c_type (CUDA_R_32F or CUDA_R_16BF); bias (null or a vector of N values of
  // C's type) is added to every row by cuBLASLt's epilogue.
  // varying: M and K change from call to call (an MoE expert's rows): the algorithm is chosen once per M and K rounded
  // up to kVaryingBucket and reused for every size in the bucket (the layouts take each call's sizes), so that a new
  // split of the tokens neither waits for cuBLASLt's heuristic nor adds a plan.
  void gemm_ex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
               int64_t ldb, float beta, void* C, int64_t ldc, cudaDataType_t ab, cudaDataType_t c_type, const void* bias,
               cudaStream_t stream, const GemmEpilogue& epilogue = {}, bool varying = false);
  static constexpr int64_t kVaryingBucket = 256;
  static int64_t varying_bucket(int64_t x) { return (x + kVaryingBucket - 1) / kVaryingBucket * kVaryingBucket; }
  // FP8 (Hopper): C[M,N] = alpha * (*a_scale) * (*b_scale) * A B^T + beta * C (+ bias, N values of C's type), A [M,K]
  // and B [N,K] row-major FP8 (CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2, not both E5M2): both K-contiguous, the only form
  // Hopper's FP8 tensor cores take; K, N and M multiples of 16. a_scale / b_scale: device pointers to the
  // dequantisation factors (the inverse scales). C bf16 or fp32. fast_accum: Hopper's faster accumulation
  // without periodic promotion to fp32 (Transformer Engine's choice for the forward GEMM only).
  //
  // Block scaling (Hopper, cuBLAS 12.9+; kernels/cuda/fp8_block.h has the layouts): a_mode / b_mode say what a_scale /
  // b_scale point to: one factor (kTensor), one per row and 128-column block of K (kVec128: 1 x 128 blocks), or one per
  // 128 x 128 block (kBlock128). Not both kBlock128; no fast accumulation with blocks.
  // varying: M and K change from call to call (an MoE expert's rows, padded to 16), as gemm_ex's: one plan per bucket of
  // M and K rounded up to kVaryingBucket, each call setting its sizes (and K, the operands' leading dimension).
  enum class ScaleMode : int8_t { kTensor, kVec128, kBlock128 };
  void gemm_fp8(int64_t M, int64_t N, int64_t K, float alpha, const void* A, cudaDataType_t a_type, const float* a_scale, const void* B,
                cudaDataType_t b_type, const float* b_scale, float beta, void* C, int64_t ldc, cudaDataType_t c_type, const void* bias,
                bool fast_accum, cudaStream_t stream, ScaleMode a_mode = ScaleMode::kTensor, ScaleMode b_mode = ScaleMode::kTensor,
                bool varying = false);
  size_t cached_fp8_plans() {
    std::lock_guard<std::mutex> lock(mu_);
    return fp8_plans_.size();
  }
  // Whether cuBLASLt has an algorithm for this GEMM (no bias input) with this epilogue; the plan is created
  // and cached if so. Lets a caller use a fused epilogue only where one exists.
  bool has_algorithm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, cudaDataType_t ab,
                     cudaDataType_t c_type, const GemmEpilogue& epilogue);
  size_t cached_plans() const { return plans_.size(); }
  // Whether new plans of GEMMs whose sizes do not vary are timed over several algorithms (on by default;
  // MEGATRAIN_GEMM_AUTOTUNE=0 turns it off at start-up; tests turn it on and off).
  void set_autotune(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    tune_ = on;
  }
  // Frees the workspace of a stream about to be destroyed.
  void release_workspace(cudaStream_t stream);

 private:
  GemmLt();
  // (the last: a varying plan, whose layouts each call resizes)
  // (the last two: varying, and beta not 0, so that a GEMM that overwrites its output and one that accumulates into it
  // are tuned apart)
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, int, int64_t, bool, bool>;
  struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
  };
  // Under mu_: the plan for key (bias: any pointer of a bias-input GEMM; epilogue pointers are set per call),
  // cached; none found: nullptr, or an exception naming the shape when `required`.
  Plan* create_plan(const Key& key, const void* bias, const GemmEpilogue& ep, bool required);
  // On unless MEGATRAIN_GEMM_AUTOTUNE=0 (read once): a new plan of a GEMM whose sizes do not vary, 16-bit or FP8, times up
  // to kTuneCandidates of cuBLASLt's heuristic algorithms on the call's own operands, after the work queued on the stream
  // so far, and keeps the fastest. A GEMM that overwrites its output (beta 0) writes the same output in each run, which
  // the call then writes again; one that accumulates (beta != 0: the weight gradients into their fp32 main gradients)
  // has C's c_bytes kept aside in a stream-ordered buffer of their own and restored after the runs (not tuned if that
  // buffer cannot be had). The epilogue, scale and bias pointers are set on plan.op for this call. Under mu_.
  static constexpr int kTuneCandidates = 8;
  bool tune_ = true;
  void tune_plan(Plan& plan, const void* A, const void* B, void* C, float beta, size_t c_bytes, cudaStream_t stream);
  void tune_candidates(Plan& plan, const void* A, const void* B, void* C, float beta, cudaStream_t stream);
  cublasLtHandle_t handle_ = nullptr;
  // One workspace per stream: GEMMs on two streams may run at the same time (tensor parallelism's
  // weight-gradient GEMMs beside the compute stream).
  void* workspace(cudaStream_t stream);
  void* workspace_locked(cudaStream_t stream);  // under mu_
  std::map<cudaStream_t, void*> workspaces_;
  size_t workspace_bytes_ = 32u << 20;
  std::mutex mu_;
  std::map<Key, Plan> plans_;
  using Fp8Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int, int, bool, bool, int, int, bool, bool>;  // (the last: varying, beta not 0)
  std::map<Fp8Key, Plan> fp8_plans_;
};

}  // namespace mt::cuda
