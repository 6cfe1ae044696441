// cuda_check.h: the one place for the check macros of every GPU library call (CUDA runtime, cuBLASLt, cuDNN,
// NCCL): a failure throws, naming the library, file:line, the call and the library's own message. Each macro
// expands where it is used, so a file includes the library header it calls and this one; nothing here
// needs cuBLAS, cuDNN or NCCL.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mt::detail {

[[noreturn]] inline void check_failed(const char* library, const char* file, int line, const char* call, const std::string& message) {
  throw std::runtime_error(std::string(library) + " error at " + file + ":" + std::to_string(line) + ": " + call + ": " + message);
}

}  // namespace mt::detail

#define MT_CUDA_CHECK(expr)                                                                          \
  do {                                                                                               \
    const cudaError_t mt_err_ = (expr);                                                              \
    if (mt_err_ != cudaSuccess) ::mt::detail::check_failed("CUDA", __FILE__, __LINE__, #expr, cudaGetErrorString(mt_err_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())

#define MT_CUBLAS_CHECK(expr)                                                                                           \
  do {                                                                                                                  \
    const cublasStatus_t mt_st_ = (expr);                                                                               \
    if (mt_st_ != CUBLAS_STATUS_SUCCESS) {                                                                              \
      ::mt::detail::check_failed("cuBLASLt", __FILE__, __LINE__, #expr, "status " + std::to_string(static_cast<int>(mt_st_))); \
    }                                                                                                                   \
  } while (0)

// cuDNN's message, with its last-error string (the graph API explains there what it refused).
#define MT_CUDNN_CHECK(expr)                                                                                             \
  do {                                                                                                                   \
    const cudnnStatus_t mt_st_ = (expr);                                                                                 \
    if (mt_st_ != CUDNN_STATUS_SUCCESS) {                                                                                \
      char mt_buf_[2048] = {0};                                                                                          \
      cudnnGetLastErrorString(mt_buf_, sizeof(mt_buf_));                                                                 \
      ::mt::detail::check_failed("cuDNN", __FILE__, __LINE__, #expr,                                                     \
                                 std::string(cudnnGetErrorString(mt_st_)) + (mt_buf_[0] ? std::string(" (") + mt_buf_ + ")" : std::string())); \
    }                                                                                                                    \
  } while (0)

// ncclInProgress is not a failure: non-blocking communicators return it while an operation completes.
#define MT_NCCL_CHECK(expr)                                                                           \
  do {                                                                                                \
    const ncclResult_t mt_res_ = (expr);                                                              \
    if (mt_res_ != ncclSuccess && mt_res_ != ncclInProgress) {                                        \
      ::mt::detail::check_failed("NCCL", __FILE__, __LINE__, #expr, ncclGetErrorString(mt_res_));     \
    }                                                                                                 \
  } while (0)
