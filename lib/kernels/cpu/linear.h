// linear.h: y = x W^T (+ b) with W stored [out, in] as Megatron does, forward and backward. GEMMs
// go to OpenBLAS (the distribution's optimised BLAS: the reference must be fast enough to train the
// quickstart and the parity tests on 2 cores, and sgemm's result is what a naive loop computes).
#pragma once
#include <cstdint>

namespace mt::cpu {

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in, int64_t out);
// dx: overwritten (or accumulated when accumulate_dx), may be null; dw and db accumulate.
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int64_t N,
                     int64_t in, int64_t out, bool accumulate_dx = false);
// The two halves of linear_backward, for schedules that run them apart (zero-bubble pipelines):
// dx = dy W (overwritten), and dw += dy^T x, db += sum of dy's rows (db may be null).
void linear_backward_input(float* dx, const float* dy, const float* w, int64_t N, int64_t in, int64_t out);
void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N, int64_t in, int64_t out);

// C[M,N] = alpha * op(A) op(B) + beta * C, row-major (a thin cblas wrapper used by attention too).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace mt::cpu
