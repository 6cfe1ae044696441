// norm.cpp: reference normalisations, double accumulation for the row statistics.
#include "kernels/cpu/norm.h"

#include <cmath>

namespace mt::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N,
                       int64_t h, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * h;
    double m = 0;
    for (int64_t i = 0; i < h; ++i) m += xr[i];
    m /= static_cast<double>(h);
    double v = 0;
    for (int64_t i = 0; i < h; ++i) v += (xr[i] - m) * (xr[i] - m);
    v /= static_cast<double>(h);
    const float r = static_cast<float>(1.0 / std::sqrt(v + eps));
    const float mf = static_cast<float>(m);
    float* o = out + n * h;
    for (int64_t i = 0; i < h; ++i) o[i] = (xr[i] - mf) * r * w[i] + (b ? b[i] : 0.0f);
    mean[n] = mf;
    rstd[n] = r;
  }
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t h) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * h;
    const float* g = dout + n * h;
    const float m = mean[n], r = rstd[n];
    double sum_g = 0, sum_gx = 0;
    for (int64_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - m) * r;
      const float gw = g[i] * w[i];
      sum_g += gw;
      sum_gx += gw * xhat;
      dw[i] += g[i] * xhat;
      if (db) db[i] += g[i];
    }
    const float mg = static_cast<float>(sum_g / static_cast<double>(h));
    const float mgx = static_cast<float>(sum_gx / static_cast<double>(h));
    float* d = dx + n * h;
    for (int64_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - m) * r;
      d[i] = r * (g[i] * w[i] - mg - xhat * mgx);
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t h, float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * h;
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
    float* o = out + n * h;
    for (int64_t i = 0; i < h; ++i) o[i] = xr[i] * r * w[i];
    rstd[n] = r;
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      int64_t N, int64_t h) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * h;
    const float* g = dout + n * h;
    const float r = rstd[n];
    double sum_gx = 0;
    for (int64_t i = 0; i < h; ++i) {
      const float xhat = xr[i] * r;
      sum_gx += static_cast<double>(g[i]) * w[i] * xhat;
      dw[i] += g[i] * xhat;
    }
    const float mgx = static_cast<float>(sum_gx / static_cast<double>(h));
    float* d = dx + n * h;
    for (int64_t i = 0; i < h; ++i) d[i] = r * (g[i] * w[i] - xr[i] * r * mgx);
  }
}

}  // namespace mt::cpu
