// router.cpp: see router.h. Scores in float, sums in double where they feed a normalisation.
#include "kernels/cpu/router.h"

#include <algorithm>
#include <string>
#include <stdexcept>
#include <functional>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/moe_scores.h"

namespace mt::cpu {
namespace {

// The k largest of v[0..m) (indices), descending, ties to the lower index.
void top_indices(const float* v, int64_t m, int64_t k, int32_t* out) {
  std::vector<int32_t> idx(static_cast<size_t>(m));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// Megatron's group_limited_topk: each group scored by the sum of its best topk / group_topk scores, the best
// group_topk groups kept, the top k over their experts.
void limited_top(const RouterSettings& s, const float* v, int32_t* out) {
  const int64_t E = s.experts;
  if (s.num_groups <= 0 || s.group_topk <= 0) {
    top_indices(v, E, s.topk, out);
    return;
  }
  const int64_t per = E / s.num_groups, best = s.topk / s.group_topk;
  std::vector<float> group_score(static_cast<size_t>(s.num_groups));
  std::vector<int32_t> tmp(static_cast<size_t>(best));
  for (int64_t g = 0; g < s.num_groups; ++g) {
    top_indices(v + g * per, per, best, tmp.data());
    double sum = 0;
    for (int32_t i : tmp) sum += v[g * per + i];
    group_score[static_cast<size_t>(g)] = static_cast<float>(sum);
  }
  std::vector<int32_t> groups(static_cast<size_t>(s.group_topk));
  top_indices(group_score.data(), s.num_groups, s.group_topk, groups.data());
  std::vector<float> masked(static_cast<size_t>(E), -std::numeric_limits<float>::infinity());
  for (int32_t g : groups) std::copy(v + g * per, v + (g + 1) * per, masked.begin() + g * per);
  top_indices(masked.data(), E, s.topk, out);
}

void softmax_row(const float* x, int64_t m, float* y) {
  float mx = x[0];
  for (int64_t i = 1; i < m; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < m; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  for (int64_t i = 0; i < m; ++i) y[i] = static_cast<float>(std::exp(static_cast<double>(x[i] - mx)) / sum);
}

// A score of its own per expert (sigmoid or sqrtsoftplus; model/moe_scores.h) and its derivative given the score s.
float elementwise_score(ScoreFunction f, float x) { return moe_elementwise_score(f == ScoreFunction::kSqrtSoftplus, x); }
double elementwise_score_derivative(ScoreFunction f, float x, double s) { return moe_elementwise_slope(f == ScoreFunction::kSqrtSoftplus, x, s); }

}  // namespace

ScoreFunction score_function_named(const std::string& name) {
  if (name == "sigmoid") return ScoreFunction::kSigmoid;
  if (name == "sqrtsoftplus") return ScoreFunction::kSqrtSoftplus;
  return ScoreFunction::kSoftmax;
}

void route_topk(const RouterSettings& s, const float* logits, const float* expert_bias, int64_t n, int32_t* top, float* weight,
                const float* choice_scores) {
  const int64_t E = s.experts, k = s.topk;
  std::vector<float> scores(static_cast<size_t>(E)), choice(static_cast<size_t>(E)), picked(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * E;
    int32_t* idx = top + t * k;
    float* w = weight + t * k;
    const bool elementwise = s.score != ScoreFunction::kSoftmax;
    if (elementwise) {
      for (int64_t e = 0; e < E; ++e) scores[static_cast<size_t>(e)] = elementwise_score(s.score, x[e]);
    } else if (s.pre_softmax) {
      softmax_row(x, E, scores.data());
    } else {
      std::copy(x, x + E, scores.begin());
    }
    if (choice_scores) {
      std::copy(choice_scores + t * E, choice_scores + (t + 1) * E, choice.begin());
    } else {
      for (int64_t e = 0; e < E; ++e) choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] + (expert_bias ? expert_bias[e] : 0.0f);
    }
    limited_top(s, choice.data(), idx);
    for (int64_t j = 0; j < k; ++j) picked[static_cast<size_t>(j)] = scores[static_cast<size_t>(idx[j])];
    if (elementwise) {
      double sum = 0;
      for (float p : picked) sum += p;
      for (int64_t j = 0; j < k; ++j) w[j] = k > 1 ? static_cast<float>(picked[static_cast<size_t>(j)] / (sum + 1e-20)) : picked[static_cast<size_t>(j)];
    } else if (s.pre_softmax) {
      std::copy(picked.begin(), picked.end(), w);
    } else {
      softmax_row(picked.data(), k, w);
    }
    for (int64_t j = 0; j < k; ++j) w[j] *= s.scaling;
  }
}

void route_topk_backward(const RouterSettings& s, const float* logits, const int32_t* top, const float* dweight, int64_t n, float* dlogits) {
  const int64_t E = s.experts, k = s.topk;
  std::vector<float> scores(static_cast<size_t>(E)), picked(static_cast<size_t>(k)), p(static_cast<size_t>(k));
  std::vector<double> dpicked(static_cast<size_t>(k));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * E;
    const int32_t* idx = top + t * k;
    float* dx = dlogits + t * E;
    std::fill(dx, dx + E, 0.0f);
    for (int64_t j = 0; j < k; ++j) dpicked[static_cast<size_t>(j)] = static_cast<double>(dweight[t * k + j]) * s.scaling;
    if (s.score != ScoreFunction::kSoftmax) {
      for (int64_t j = 0; j < k; ++j) picked[static_cast<size_t>(j)] = elementwise_score(s.score, x[idx[j]]);
      if (k > 1) {  // w_j = s_j / (sum + eps): dw/ds_i = delta_ij / sum - s_j / sum^2
        double sum = 1e-20, dot = 0;
        for (int64_t j = 0; j < k; ++j) sum += picked[static_cast<size_t>(j)];
        for (int64_t j = 0; j < k; ++j) dot += dpicked[static_cast<size_t>(j)] * picked[static_cast<size_t>(j)];
        for (int64_t j = 0; j < k; ++j) dpicked[static_cast<size_t>(j)] = dpicked[static_cast<size_t>(j)] / sum - dot / (sum * sum);
      }
      for (int64_t j = 0; j < k; ++j) {
        const double slope = elementwise_score_derivative(s.score, x[idx[j]], picked[static_cast<size_t>(j)]);
        dx[idx[j]] += static_cast<float>(dpicked[static_cast<size_t>(j)] * slope);
      }
    } else if (s.pre_softmax) {  // through the softmax over all experts
      softmax_row(x, E, scores.data());
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += dpicked[static_cast<size_t>(j)] * scores[static_cast<size_t>(idx[j])];
      for (int64_t e = 0; e < E; ++e) dx[e] = static_cast<float>(-scores[static_cast<size_t>(e)] * dot);
      for (int64_t j = 0; j < k; ++j) dx[idx[j]] += static_cast<float>(scores[static_cast<size_t>(idx[j])] * dpicked[static_cast<size_t>(j)]);
    } else {  // through the softmax over the k chosen logits
      for (int64_t j = 0; j < k; ++j) picked[static_cast<size_t>(j)] = x[idx[j]];
      softmax_row(picked.data(), k, p.data());
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += dpicked[static_cast<size_t>(j)] * p[static_cast<size_t>(j)];
      for (int64_t j = 0; j < k; ++j) dx[idx[j]] += static_cast<float>(p[static_cast<size_t>(j)] * (dpicked[static_cast<size_t>(j)] - dot));
    }
  }
}

std::vector<float> sinkhorn_normalize(const float* logits, int64_t n, int64_t experts) {
  const size_t N = static_cast<size_t>(n), E = static_cast<size_t>(experts);
  std::vector<float> cost(N * E), d0(N, 1.0f), d1(E, 1.0f), d1_old(E, 1.0f);
  for (size_t i = 0; i < N * E; ++i) cost[i] = std::exp(logits[i]);
  const float eps = 1e-8f, tol = 1e-4f;
  for (int round = 0; round < kSinkhornMaxIterations; ++round) {
    for (size_t t = 0; t < N; ++t) {
      float sum = 0;
      for (size_t e = 0; e < E; ++e) sum += d1[e] * cost[t * E + e];
      d0[t] = (1.0f / static_cast<float>(N)) * 1.0f / (sum + eps);
    }
    float error = 0;
    for (size_t e = 0; e < E; ++e) {
      float sum = 0;
      for (size_t t = 0; t < N; ++t) sum += d0[t] * cost[t * E + e];
      d1[e] = (1.0f / static_cast<float>(E)) * 1.0f / (sum + eps);
      error += std::fabs(d1_old[e] - d1[e]);
    }
    d1_old = d1;
    if (!(error / static_cast<float>(E) > tol)) break;  // (Megatron's `while error > tol`: a NaN stops it too)
  }
  for (size_t t = 0; t < N; ++t) {
    for (size_t e = 0; e < E; ++e) cost[t * E + e] = d1[e] * cost[t * E + e] * d0[t];
  }
  return cost;
}

void quantile_choice_scores(const float* logits, const float* beta, int64_t n, int64_t experts, int64_t topk, float* choice, float* shifted) {
  if (topk >= experts) throw std::invalid_argument("quantile balancing: top-k must be below the experts");
  std::vector<float> row(static_cast<size_t>(experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * experts;
    for (int64_t e = 0; e < experts; ++e) choice[t * experts + e] = x[e] - beta[e];
    std::copy(choice + t * experts, choice + (t + 1) * experts, row.begin());
    std::nth_element(row.begin(), row.begin() + topk, row.end(), std::greater<float>());
    const float alpha = row[static_cast<size_t>(topk)];
    for (int64_t e = 0; e < experts; ++e) shifted[t * experts + e] = x[e] - alpha;
  }
}

void column_quantiles(const float* shifted, int64_t m, int64_t experts, int64_t topk, float* quantile) {
  const int64_t target = m * topk / experts;
  if ((m * topk) % experts != 0 || target >= m) {
    throw std::invalid_argument("quantile balancing: the tokens' choices (" + std::to_string(m * topk) + ") not a multiple of the " +
                                std::to_string(experts) + " experts");
  }
  std::vector<float> column(static_cast<size_t>(m));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t t = 0; t < m; ++t) column[static_cast<size_t>(t)] = shifted[t * experts + e];
    std::nth_element(column.begin(), column.begin() + target, column.end(), std::greater<float>());
    quantile[e] = column[static_cast<size_t>(target)];
  }
}

int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t topk, int64_t experts) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens * topk) / static_cast<double>(experts) * capacity_factor));
}

namespace {

}  // namespace

std::vector<int64_t> megatron_token_order(int64_t n, int64_t seq_length) {
  const int64_t S = seq_length > 0 ? seq_length : n, B = n / S;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) order.push_back(b * S + s);
  }
  return order;
}

namespace {

// The (token, slot) choices of expert e in keep order: highest weight first (ties: earlier token), or by position.
std::vector<std::pair<int64_t, int64_t>> expert_order(const int32_t* top, const float* weight, const std::vector<int64_t>& order, int64_t topk,
                                                      int64_t e, bool by_probability) {
  std::vector<std::pair<int64_t, int64_t>> mine;
  for (int64_t t : order) {
    for (int64_t j = 0; j < topk; ++j) {
      if (top[t * topk + j] == e) mine.emplace_back(t, j);
    }
  }
  if (by_probability) {
    std::stable_sort(mine.begin(), mine.end(), [&](const auto& a, const auto& b) {
      return weight[a.first * topk + a.second] > weight[b.first * topk + b.second];
    });
  }
  return mine;
}

}  // namespace

void capacity_keep(const int32_t* top, const float* weight, const std::vector<int64_t>& order, int64_t topk, int64_t experts, int64_t capacity,
                   bool by_probability, uint8_t* keep) {
  const auto n = static_cast<int64_t>(order.size());
  std::fill(keep, keep + n * topk, uint8_t{0});
  for (int64_t e = 0; e < experts; ++e) {
    const auto mine = expert_order(top, weight, order, topk, e, by_probability);
    for (size_t i = 0; i < mine.size() && static_cast<int64_t>(i) < capacity; ++i) keep[mine[i].first * topk + mine[i].second] = 1;
  }
}

std::vector<std::vector<int64_t>> capacity_padding(const int32_t* top, const uint8_t* keep, const std::vector<int64_t>& order, int64_t topk,
                                                   int64_t experts, int64_t capacity) {
  const auto n = static_cast<int64_t>(order.size());
  std::vector<std::vector<int64_t>> pad(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    int64_t kept = 0;
    std::vector<char> routed(static_cast<size_t>(n), 0);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < topk; ++j) {
        if (top[t * topk + j] == e) {
          routed[static_cast<size_t>(t)] = 1;
          kept += keep[t * topk + j];
        }
      }
    }
    // Megatron's capacity mask takes the expert's top `capacity` rows of its weight column, where the tokens it
    // does not route to weigh 0: after the routed ones, in token order (ties), whatever the drop policy's order.
    for (size_t i = 0; i < order.size() && kept < capacity; ++i) {
      const int64_t t = order[i];
      if (routed[static_cast<size_t>(t)]) continue;
      pad[static_cast<size_t>(e)].push_back(t);
      ++kept;
    }
  }
  return pad;
}

ExpertRows place_expert_rows(const int32_t* top, const uint8_t* keep, const std::vector<std::vector<int64_t>>& pads, int64_t n, int64_t topk,
                             int64_t experts, int64_t first, int64_t last, int64_t align) {
  const auto mine = [&](int64_t token) { return token >= first && token < last; };
  const auto E = static_cast<size_t>(experts);
  ExpertRows out;
  out.per_expert.assign(E, 0);
  // (the slice's pads, in token order)
  std::vector<std::vector<int64_t>> slice(E);
  for (size_t e = 0; e < E && !pads.empty(); ++e) {
    for (int64_t t : pads[e]) {
      if (mine(t)) slice[e].push_back(t);
    }
    std::sort(slice[e].begin(), slice[e].end());
    out.per_expert[e] += static_cast<int32_t>(slice[e].size());
  }
  for (int64_t i = 0; i < n * topk; ++i) {
    if (keep[i] && mine(i / topk)) ++out.per_expert[static_cast<size_t>(top[i])];
  }
  // Each expert's rows from its first: a kept choice of token t takes the next row after the pads of tokens before t.
  std::vector<int32_t> at(E, 0);
  for (size_t e = 1; e < E; ++e) {
    const int64_t prev = out.per_expert[e - 1];
    at[e] = at[e - 1] + static_cast<int32_t>((prev + align - 1) / align * align);
  }
  std::vector<size_t> next(E, 0);
  const auto pads_before = [&](size_t e, int64_t token) {  // the expert's pads of tokens before `token`, placed
    while (next[e] < slice[e].size() && slice[e][next[e]] < token) {
      out.pad_map.push_back(at[e]++);
      out.pad_map.push_back(static_cast<int32_t>(slice[e][next[e]++]));
    }
  };
  out.row.assign(static_cast<size_t>(n * topk), -1);
  for (int64_t i = 0; i < n * topk; ++i) {
    if (!keep[i] || !mine(i / topk)) continue;
    const auto e = static_cast<size_t>(top[i]);
    pads_before(e, i / topk);
    out.row[static_cast<size_t>(i)] = at[e]++;
  }
  for (size_t e = 0; e < E; ++e) pads_before(e, n);
  return out;
}

void aux_scores(const float* logits, int64_t n, int64_t experts, ScoreFunction score, float* scores) {
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * experts;
    float* y = scores + t * experts;
    if (score == ScoreFunction::kSoftmax) {
      softmax_row(x, experts, y);
      continue;
    }
    double sum = 1e-20;
    for (int64_t e = 0; e < experts; ++e) sum += (y[e] = elementwise_score(score, x[e]));
    for (int64_t e = 0; e < experts; ++e) y[e] = static_cast<float>(y[e] / sum);
  }
}

void aux_topk_counts(const float* scores, int64_t n, int64_t experts, int64_t topk, double* counts) {
  std::vector<int32_t> idx(static_cast<size_t>(topk));
  for (int64_t t = 0; t < n; ++t) {
    top_indices(scores + t * experts, experts, topk, idx.data());
    for (int32_t e : idx) counts[e] += 1;
  }
}

void aux_scores_backward(const float* logits, const float* dscores, int64_t n, int64_t experts, ScoreFunction score, float* dlogits) {
  std::vector<float> y(static_cast<size_t>(experts)), sg(static_cast<size_t>(experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * experts;
    const float* dy = dscores + t * experts;
    float* dx = dlogits + t * experts;
    if (score == ScoreFunction::kSoftmax) {
      softmax_row(x, experts, y.data());
      double dot = 0;
      for (int64_t e = 0; e < experts; ++e) dot += static_cast<double>(dy[e]) * y[static_cast<size_t>(e)];
      for (int64_t e = 0; e < experts; ++e) dx[e] += static_cast<float>(y[static_cast<size_t>(e)] * (dy[e] - dot));
      continue;
    }
    double sum = 1e-20, dot = 0;
    for (int64_t e = 0; e < experts; ++e) sum += (sg[static_cast<size_t>(e)] = elementwise_score(score, x[e]));
    for (int64_t e = 0; e < experts; ++e) dot += static_cast<double>(dy[e]) * sg[static_cast<size_t>(e)];
    for (int64_t e = 0; e < experts; ++e) {
      const double ds = dy[e] / sum - dot / (sum * sum);
      dx[e] += static_cast<float>(ds * elementwise_score_derivative(score, x[e], sg[static_cast<size_t>(e)]));
    }
  }
}

double z_loss_sum(const float* logits, int64_t n, int64_t experts) {
  double total = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * experts;
    float mx = x[0];
    for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, x[e]);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(x[e] - mx));
    const double lse = mx + std::log(sum);
    total += lse * lse;
  }
  return total;
}

void z_loss_backward(const float* logits, int64_t n, int64_t experts, float scale, float* dlogits) {
  std::vector<float> p(static_cast<size_t>(experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* x = logits + t * experts;
    softmax_row(x, experts, p.data());
    float mx = x[0];
    for (int64_t e = 1; e < experts; ++e) mx = std::max(mx, x[e]);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += std::exp(static_cast<double>(x[e] - mx));
    const double lse = mx + std::log(sum);
    for (int64_t e = 0; e < experts; ++e) dlogits[t * experts + e] += static_cast<float>(scale * 2.0 * lse * p[static_cast<size_t>(e)]);
  }
}

}  // namespace mt::cpu
