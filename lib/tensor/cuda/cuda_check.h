// cuda_check.h: every CUDA runtime call checked, the failure naming file:line and the call.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define MT_CUDA_CHECK(expr)                                                                                       \
  do {                                                                                                            \
    const cudaError_t mt_err_ = (expr);                                                                           \
    if (mt_err_ != cudaSuccess) {                                                                                 \
      throw std::runtime_error(std::string("CUDA error at ") + __FILE__ + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": " + cudaGetErrorString(mt_err_));                                      \
    }                                                                                                             \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())
