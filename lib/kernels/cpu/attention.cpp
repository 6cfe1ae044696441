// attention.cpp: reference attention on BLAS GEMMs per (batch, head), probabilities kept in fp32.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/linear.h"
#include "tensor/rng.h"

namespace mt::cpu {

void qkv_split(float* q, float* k, float* v, const float* qkv, int64_t T, int64_t nh, int64_t ng, int64_t d) {
  const int64_t per = nh / ng;
  const int64_t row = (nh + 2 * ng) * d;
  for (int64_t t = 0; t < T; ++t) {
    const float* src = qkv + t * row;
    for (int64_t g = 0; g < ng; ++g) {
      const float* grp = src + g * (per + 2) * d;
      std::memcpy(q + (t * nh + g * per) * d, grp, static_cast<size_t>(per * d) * sizeof(float));
      std::memcpy(k + (t * ng + g) * d, grp + per * d, static_cast<size_t>(d) * sizeof(float));
      std::memcpy(v + (t * ng + g) * d, grp + (per + 1) * d, static_cast<size_t>(d) * sizeof(float));
    }
  }
}

void qkv_merge(float* dqkv, const float* dq, const float* dk, const float* dv, int64_t T, int64_t nh, int64_t ng, int64_t d) {
  const int64_t per = nh / ng;
  const int64_t row = (nh + 2 * ng) * d;
  for (int64_t t = 0; t < T; ++t) {
    float* dst = dqkv + t * row;
    for (int64_t g = 0; g < ng; ++g) {
      float* grp = dst + g * (per + 2) * d;
      std::memcpy(grp, dq + (t * nh + g * per) * d, static_cast<size_t>(per * d) * sizeof(float));
      std::memcpy(grp + per * d, dk + (t * ng + g) * d, static_cast<size_t>(d) * sizeof(float));
      std::memcpy(grp + (per + 1) * d, dv + (t * ng + g) * d, static_cast<size_t>(d) * sizeof(float));
    }
  }
}

namespace {

bool keep(const AttentionShape& s, int64_t b, int64_t h, int64_t i, int64_t j) {
  return attention_dropout_keeps(s.dropout_key, s.sample0 + b, s.head0 + h, i, j, s.S, s.dropout);
}

// P with dropout applied, into dst ([S,S]).
void dropped_probs(float* dst, const float* P, const AttentionShape& s, int64_t b, int64_t h) {
  const float keep_scale = 1.0f / (1.0f - s.dropout);
  for (int64_t i = 0; i < s.S; ++i) {
    for (int64_t j = 0; j < s.S; ++j) {
      const float p = P[i * s.S + j];
      dst[i * s.S + j] = keep(s, b, h, i, j) ? p * keep_scale : 0.0f;
    }
  }
}

}  // namespace

bool attention_dropout_keeps(uint64_t key, int64_t sample, int64_t head, int64_t i, int64_t j, int64_t S, float p) {
  const auto idx = static_cast<uint64_t>((head * S + i) * S + j);
  return philox_uniform(key, idx, static_cast<uint64_t>(sample)) >= p;
}

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v, const AttentionShape& s) {
  const int64_t S = s.S, d = s.d, nh = s.nh, ng = s.ng, per = nh / ng;
  std::vector<float> dropped(s.dropout > 0 ? static_cast<size_t>(S * S) : 0);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / per;
      const float* qb = q + (b * S * nh + h) * d;
      const float* kb = k + (b * S * ng + g) * d;
      const float* vb = v + (b * S * ng + g) * d;
      float* P = probs + (b * nh + h) * S * S;
      gemm(false, true, S, S, d, s.scale, qb, nh * d, kb, ng * d, 0.0f, P, S);
      for (int64_t i = 0; i < S; ++i) {
        float* row = P + i * S;
        int64_t lo = s.row_start ? std::clamp<int64_t>(s.row_start[b * S + i], 0, i) : 0;
        if (s.window >= 0) lo = std::max(lo, i - s.window);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = lo; j <= i; ++j) mx = std::max(mx, row[j]);
        if (s.sink) mx = std::max(mx, s.sink[h]);
        double sum = s.sink ? std::exp(static_cast<double>(s.sink[h]) - mx) : 0.0;  // (the sink's share of the denominator)
        for (int64_t j = lo; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        if (s.sink && s.sink_probs) s.sink_probs[(b * nh + h) * S + i] = static_cast<float>(std::exp(static_cast<double>(s.sink[h]) - mx) / sum);
        for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
        for (int64_t j = lo; j <= i; ++j) row[j] *= inv;
        for (int64_t j = i + 1; j < S; ++j) row[j] = 0.0f;
      }
      const float* Pv = P;
      if (s.dropout > 0) {
        dropped_probs(dropped.data(), P, s, b, h);
        Pv = dropped.data();
      }
      gemm(false, false, S, d, S, 1.0f, Pv, S, vb, ng * d, 0.0f, out + (b * S * nh + h) * d, nh * d);
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs, const float* q,
                        const float* k, const float* v, const AttentionShape& s, float* scratch) {
  const int64_t S = s.S, d = s.d, nh = s.nh, ng = s.ng, per = nh / ng;
  if (s.sink_grad && !s.sink_probs) throw std::logic_error("attention_backward: the sinks' gradient needs the forward's sink probabilities");
  std::memset(dk, 0, static_cast<size_t>(s.B * S * ng * d) * sizeof(float));
  std::memset(dv, 0, static_cast<size_t>(s.B * S * ng * d) * sizeof(float));
  std::vector<float> dropped(s.dropout > 0 ? static_cast<size_t>(S * S) : 0);
  const float keep_scale = s.dropout > 0 ? 1.0f / (1.0f - s.dropout) : 1.0f;
  float* dP = scratch;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / per;
      const float* qb = q + (b * S * nh + h) * d;
      const float* kb = k + (b * S * ng + g) * d;
      const float* vb = v + (b * S * ng + g) * d;
      const float* dob = dout + (b * S * nh + h) * d;
      const float* P = probs + (b * nh + h) * S * S;
      const float* Pv = P;
      if (s.dropout > 0) {
        dropped_probs(dropped.data(), P, s, b, h);
        Pv = dropped.data();
      }
      // dV += P'^T dO ; dP' = dO V^T
      gemm(true, false, S, d, S, 1.0f, Pv, S, dob, nh * d, 1.0f, dv + (b * S * ng + g) * d, ng * d);
      gemm(false, true, S, S, d, 1.0f, dob, nh * d, vb, ng * d, 0.0f, dP, S);
      for (int64_t i = 0; i < S; ++i) {
        float* row = dP + i * S;
        const float* prow = P + i * S;
        if (s.dropout > 0) {
          for (int64_t j = 0; j <= i; ++j) row[j] = keep(s, b, h, i, j) ? row[j] * keep_scale : 0.0f;
        }
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(row[j]) * prow[j];
        const float dotf = static_cast<float>(dot);
        // The sink's logit gets p_sink (0 - dot): its value is zero.
        if (s.sink_grad) s.sink_grad[h] -= static_cast<float>(s.sink_probs[(b * nh + h) * S + i] * dot);
        for (int64_t j = 0; j <= i; ++j) row[j] = prow[j] * (row[j] - dotf);
        for (int64_t j = i + 1; j < S; ++j) row[j] = 0.0f;
      }
      // dQ = scale dS K ; dK += scale dS^T Q
      gemm(false, false, S, d, S, s.scale, dP, S, kb, ng * d, 0.0f, dq + (b * S * nh + h) * d, nh * d);
      gemm(true, false, S, d, S, s.scale, dP, S, qb, nh * d, 1.0f, dk + (b * S * ng + g) * d, ng * d);
    }
  }
}

}  // namespace mt::cpu
