// embedding.cpp: reference embedding lookup and scatter-add.
#include "kernels/cpu/embedding.h"

#include <cstring>

namespace mt::cpu {

void embedding_forward(float* out, const int32_t* tokens, const int32_t* positions, const float* wte, const float* wpe,
                       int64_t T, int64_t h, int64_t vocab_start, int64_t vocab_local) {
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * h;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_local) {
      std::memcpy(o, wte + id * h, static_cast<size_t>(h) * sizeof(float));
    } else {
      std::memset(o, 0, static_cast<size_t>(h) * sizeof(float));
    }
    if (wpe) {
      const float* p = wpe + static_cast<int64_t>(positions[t]) * h;
      for (int64_t i = 0; i < h; ++i) o[i] += p[i];
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, const int32_t* positions,
                        int64_t T, int64_t h, int64_t vocab_start, int64_t vocab_local) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dout + t * h;
    const int64_t id = static_cast<int64_t>(tokens[t]) - vocab_start;
    if (id >= 0 && id < vocab_local) {
      float* w = dwte + id * h;
      for (int64_t i = 0; i < h; ++i) w[i] += g[i];
    }
    if (dwpe) {
      float* p = dwpe + static_cast<int64_t>(positions[t]) * h;
      for (int64_t i = 0; i < h; ++i) p[i] += g[i];
    }
  }
}

}  // namespace mt::cpu
