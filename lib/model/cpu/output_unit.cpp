// output_unit.cpp: the final norm, the vocab-parallel output layer and the cross entropy on the CPU engine
// (the loss combines the vocabulary shards over TP: no full logits on any rank).
#include <algorithm>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/linear.h"
#include "model/cpu/units.h"

namespace mt::cpu {
float OutputUnit::forward(const PassContext& c, Buf& x, Stash& R) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h;
  R.x = std::move(x);
  R.ln.resize(sz(Tl * h));
  R.mean.resize(sz(Tl));
  R.rstd.resize(sz(Tl));
  c.norm_forward(R.ln.data(), R.mean.data(), R.rstd.data(), R.x.data(), norm_w, norm_b, Tl, h);
  R.ln_full.resize(sz(T * h));
  c.gather_tokens(R.ln.data(), R.ln_full.data());
  R.logits.resize(sz(T * D.V_local));
  linear_forward(R.logits.data(), R.ln_full.data(), c.P(weight), nullptr, T, h, D.V_local);
  R.lse.resize(sz(T));
  R.losses.resize(sz(T));
  const ProcessGroups& g = c.groups;
  VocabReduce reduce{[&g](float* v, int64_t n) { g.tp->all_reduce(v, n, ReduceOp::kMax); },
                     [&g](float* v, int64_t n) { g.tp->all_reduce(v, n, ReduceOp::kSum); }};
  cross_entropy_forward(R.losses.data(), R.lse.data(), R.logits.data(), c.mb.labels.data(), T, D.V_local, D.tp_rank * D.V_local,
                        D.tp > 1 ? &reduce : nullptr);
  double num = 0, den = 0;
  for (int64_t i = 0; i < T; ++i) {
    num += static_cast<double>(R.losses[sz(i)]) * c.mb.loss_mask[sz(i)];
    den += c.mb.loss_mask[sz(i)];
  }
  R.denom = static_cast<float>(std::max(den, 1.0));
  return static_cast<float>(num / std::max(den, 1.0));
}

void OutputUnit::backward(const PassContext& c, float scale, Buf& dx, Stash& R) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h, V = D.V_local;
  Buf dloss(sz(T));
  for (int64_t i = 0; i < T; ++i) dloss[sz(i)] = c.mb.loss_mask[sz(i)] * scale / R.denom;
  // The logits' gradient is written over the logits.
  cross_entropy_backward(R.logits.data(), R.logits.data(), R.lse.data(), c.mb.labels.data(), dloss.data(), T, V, D.tp_rank * V);
  Buf full(sz(T * h)), local(sz(Tl * h));
  linear_backward_input(full.data(), R.logits.data(), c.P(weight), T, h, V);
  c.weight_grad(R.logits.data(), T * V, [&c, &R, this, T, h, V](const float* dy) {
    linear_backward_weight(c.G(weight), nullptr, dy, R.ln_full.data(), T, h, V);
  });
  c.reduce_tokens(full.data(), local.data());
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), local.data(), R.x.data(), R.mean.data(), R.rstd.data(), norm_w, norm_b, Tl, h);
}

}  // namespace mt::cpu
