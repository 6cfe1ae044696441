// linear.cpp: OpenBLAS-backed linear layer.
#include "kernels/cpu/linear.h"

#if defined(MEGATRAIN_HAVE_CBLAS)
#include <cblas.h>
#endif

#include <cstddef>
#include <vector>

namespace mt::cpu {

#if defined(MEGATRAIN_HAVE_CBLAS)
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}
#else
// Without a BLAS: row-major loops ordered so the innermost runs over contiguous memory.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  auto a = [&](int64_t i, int64_t p) { return trans_a ? A[p * lda + i] : A[i * lda + p]; };
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    for (int64_t p = 0; p < K; ++p) row[static_cast<size_t>(p)] = alpha * a(i, p);
    if (trans_b) {
      for (int64_t j = 0; j < N; ++j) {
        const float* b = B + j * ldb;
        float s = 0;
        for (int64_t p = 0; p < K; ++p) s += row[static_cast<size_t>(p)] * b[p];
        c[j] += s;
      }
    } else {
      for (int64_t p = 0; p < K; ++p) {
        const float r = row[static_cast<size_t>(p)];
        const float* b = B + p * ldb;
        for (int64_t j = 0; j < N; ++j) c[j] += r * b[j];
      }
    }
  }
}
#endif

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t N, int64_t in, int64_t out) {
  gemm(false, true, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (b) {
    for (int64_t n = 0; n < N; ++n) {
      float* row = y + n * out;
      for (int64_t o = 0; o < out; ++o) row[o] += b[o];
    }
  }
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int64_t N,
                     int64_t in, int64_t out, bool accumulate_dx) {
  if (dx) gemm(false, false, N, in, out, 1.0f, dy, out, w, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  linear_backward_weight(dw, db, dy, x, N, in, out);
}

void linear_backward_input(float* dx, const float* dy, const float* w, int64_t N, int64_t in, int64_t out) {
  gemm(false, false, N, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void linear_backward_weight(float* dw, float* db, const float* dy, const float* x, int64_t N, int64_t in, int64_t out) {
  gemm(true, false, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) {
    for (int64_t n = 0; n < N; ++n) {
      const float* row = dy + n * out;
      for (int64_t o = 0; o < out; ++o) db[o] += row[o];
    }
  }
}

}  // namespace mt::cpu
