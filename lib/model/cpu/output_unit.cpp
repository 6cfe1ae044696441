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
  double sums[2] = {0, 0};  // masked losses, unmasked tokens
  for (int64_t i = 0; i < T; ++i) {
    sums[0] += static_cast<double>(R.losses[sz(i)]) * c.mb.loss_mask[sz(i)];
    sums[1] += c.mb.loss_mask[sz(i)];
  }
  // Context parallelism: the loss of the whole sequences, over every CP rank's tokens.
  if (D.cp > 1) c.groups.cp->all_reduce(sums, 2, ReduceOp::kSum);
  // --calculate-per-token-loss: the sum, normalised by the whole global batch's tokens once they are counted.
  R.denom = D.per_token_loss ? 1.0f : static_cast<float>(std::max(sums[1], 1.0));
  return static_cast<float>(D.per_token_loss ? sums[0] : sums[0] / std::max(sums[1], 1.0));
}

void OutputUnit::backward(const PassContext& c, float scale, Buf& dx, Stash& R, const Buf* dln) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h, V = D.V_local;
  Buf dloss(sz(T));
  // x CP: the gradients are averaged over DP x CP, but each CP rank's is a part of the sequence's (Megatron's loss
  // times the CP size).
  const float cp = static_cast<float>(D.cp);
  for (int64_t i = 0; i < T; ++i) dloss[sz(i)] = c.mb.loss_mask[sz(i)] * scale * cp / R.denom;
  // The logits' gradient is written over the logits.
  cross_entropy_backward(R.logits.data(), R.logits.data(), R.lse.data(), c.mb.labels.data(), dloss.data(), T, V, D.tp_rank * V);
  Buf full(sz(T * h)), local(sz(Tl * h));
  linear_backward_input(full.data(), R.logits.data(), c.P(weight), T, h, V);
  c.weight_grad(R.logits.data(), T * V, [&c, &R, this, T, h, V](const float* dy) {
    linear_backward_weight(c.G(weight), nullptr, dy, R.ln_full.data(), T, h, V);
  });
  c.reduce_tokens(full.data(), local.data());
  if (dln) {
    for (size_t i = 0; i < local.size(); ++i) local[i] += (*dln)[i];
  }
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), local.data(), R.x.data(), R.mean.data(), R.rstd.data(), norm_w, norm_b, Tl, h);
}

}  // namespace mt::cpu
