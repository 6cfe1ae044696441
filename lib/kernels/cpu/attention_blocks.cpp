// attention_blocks.cpp: see attention_blocks.h. Plain loops in double where they sum (the reference, not fast).
#include "kernels/cpu/attention_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/attention.h"

namespace mt::cpu {

float BlockAttention::dropped(int64_t b, int64_t hd, int64_t i, int64_t j) const {
  if (dropout <= 0) return 1.0f;
  return attention_dropout_keeps(dropout_key, sample0 + b, head0 + hd, q_pos[b * Sq + i], k_pos[b * Sk + j], seq_total, dropout)
             ? 1.0f / (1.0f - dropout)
             : 0.0f;
}

void block_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, const BlockAttention& s) {
  const int64_t per = s.nh / s.ng;
  std::vector<double> score(static_cast<size_t>(s.Sk)), acc(static_cast<size_t>(s.d));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t hd = 0; hd < s.nh; ++hd) {
      const int64_t g = hd / per;
      for (int64_t i = 0; i < s.Sq; ++i) {
        const float* qi = q + ((b * s.Sq + i) * s.nh + hd) * s.d;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < s.Sk; ++j) {
          if (!s.allowed(b, i, j)) continue;
          const float* kj = k + ((b * s.Sk + j) * s.ng + g) * s.d;
          double dot = 0;
          for (int64_t e = 0; e < s.d; ++e) dot += static_cast<double>(qi[e]) * kj[e];
          score[static_cast<size_t>(j)] = dot * s.scale;
          mx = std::max(mx, score[static_cast<size_t>(j)]);
        }
        float* o = out + ((b * s.Sq + i) * s.nh + hd) * s.d;
        float& l = lse[(b * s.nh + hd) * s.Sq + i];
        if (mx == -std::numeric_limits<double>::infinity()) {
          std::fill(o, o + s.d, 0.0f);
          l = -std::numeric_limits<float>::infinity();
          continue;
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < s.Sk; ++j) {
          if (!s.allowed(b, i, j)) continue;
          const double p = std::exp(score[static_cast<size_t>(j)] - mx);
          sum += p;
          const double pd = p * s.dropped(b, hd, i, j);
          const float* vj = v + ((b * s.Sk + j) * s.ng + g) * s.d;
          for (int64_t e = 0; e < s.d; ++e) acc[static_cast<size_t>(e)] += pd * vj[e];
        }
        for (int64_t e = 0; e < s.d; ++e) o[e] = static_cast<float>(acc[static_cast<size_t>(e)] / sum);
        l = static_cast<float>(mx + std::log(sum));
      }
    }
  }
}

void merge_attention_block(float* acc, float* acc_lse, const float* out, const float* lse, int64_t B, int64_t Sq, int64_t nh, int64_t d) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t hd = 0; hd < nh; ++hd) {
      for (int64_t i = 0; i < Sq; ++i) {
        float& la = acc_lse[(b * nh + hd) * Sq + i];
        const float lb = lse[(b * nh + hd) * Sq + i];
        if (lb == ninf) continue;
        float* a = acc + ((b * Sq + i) * nh + hd) * d;
        const float* o = out + ((b * Sq + i) * nh + hd) * d;
        if (la == ninf) {
          std::copy(o, o + d, a);
          la = lb;
          continue;
        }
        const double m = std::max(la, lb);
        const double wa = std::exp(static_cast<double>(la) - m), wb = std::exp(static_cast<double>(lb) - m);
        const double sum = wa + wb;
        for (int64_t e = 0; e < d; ++e) a[e] = static_cast<float>((wa * a[e] + wb * o[e]) / sum);
        la = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

void merge_attention_sink(float* acc, float* acc_lse, const float* sink, int64_t B, int64_t Sq, int64_t nh, int64_t d) {
  // (merge_attention_block with a block whose output is 0: the row scaled by its share, the sink added to its lse)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t hd = 0; hd < nh; ++hd) {
      for (int64_t i = 0; i < Sq; ++i) {
        float& la = acc_lse[(b * nh + hd) * Sq + i];
        const double m = std::max(la, sink[hd]);
        const double wa = std::exp(static_cast<double>(la) - m), sum = wa + std::exp(static_cast<double>(sink[hd]) - m);
        float* a = acc + ((b * Sq + i) * nh + hd) * d;
        for (int64_t e = 0; e < d; ++e) a[e] = static_cast<float>(wa * a[e] / sum);
        la = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

void attention_sink_grad(float* sink_grad, const float* dout, const float* out, const float* lse, const float* sink, int64_t B, int64_t Sq, int64_t nh,
                         int64_t d) {
  for (int64_t hd = 0; hd < nh; ++hd) {
    double acc = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < Sq; ++i) {
        const float* o = out + ((b * Sq + i) * nh + hd) * d;
        const float* g = dout + ((b * Sq + i) * nh + hd) * d;
        double row = 0;
        for (int64_t e = 0; e < d; ++e) row += static_cast<double>(o[e]) * g[e];
        acc += std::exp(static_cast<double>(sink[hd]) - lse[(b * nh + hd) * Sq + i]) * row;
      }
    }
    sink_grad[hd] -= static_cast<float>(acc);
  }
}

void block_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse, const float* q, const float* k,
                              const float* v, const BlockAttention& s) {
  const int64_t per = s.nh / s.ng;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t hd = 0; hd < s.nh; ++hd) {
      const int64_t g = hd / per;
      for (int64_t i = 0; i < s.Sq; ++i) {
        const float l = lse[(b * s.nh + hd) * s.Sq + i];
        if (l == -std::numeric_limits<float>::infinity()) continue;
        const int64_t qi_off = ((b * s.Sq + i) * s.nh + hd) * s.d;
        const float* qi = q + qi_off;
        const float* doi = dout + qi_off;
        const float* oi = out + qi_off;
        double delta = 0;  // sum_e dO_ie O_ie
        for (int64_t e = 0; e < s.d; ++e) delta += static_cast<double>(doi[e]) * oi[e];
        for (int64_t j = 0; j < s.Sk; ++j) {
          if (!s.allowed(b, i, j)) continue;
          const int64_t kj_off = ((b * s.Sk + j) * s.ng + g) * s.d;
          const float* kj = k + kj_off;
          const float* vj = v + kj_off;
          double dot = 0, dp = 0;
          for (int64_t e = 0; e < s.d; ++e) {
            dot += static_cast<double>(qi[e]) * kj[e];
            dp += static_cast<double>(doi[e]) * vj[e];
          }
          const double p = std::exp(dot * s.scale - l), m = s.dropped(b, hd, i, j);
          const double ds = p * (dp * m - delta) * s.scale;
          for (int64_t e = 0; e < s.d; ++e) {
            dq[qi_off + e] += static_cast<float>(ds * kj[e]);
            dk[kj_off + e] += static_cast<float>(ds * qi[e]);
            dv[kj_off + e] += static_cast<float>(p * m * doi[e]);
          }
        }
      }
    }
  }
}

}  // namespace mt::cpu
