// mtp_unit.cpp: multi-token prediction's input projection on the CPU engine (Megatron's MultiTokenPredictionLayer's
// _concat_embeddings): x = W [enorm(e) | hnorm(h)] over this rank's tokens, W [h, 2h] whole on every TP rank (Megatron
// splits its output over TP and gathers it: the same values), and the shifted microbatch each module sees.
#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/linear.h"
#include "model/cpu/units.h"

namespace mt::cpu {

Microbatch mtp_shifted(const Microbatch& mb, int64_t k) {
  if (!mb.seq_pos.empty()) throw std::logic_error("mtp_shifted: a context-parallel slice (shift the whole sequences, then slice them)");
  Microbatch out = mb;
  out.mtp.clear();
  const int64_t S = mb.S;
  auto shift = [&](auto& v) {
    for (int64_t b = 0; b < mb.B; ++b) {
      auto row = v.begin() + b * S;
      const int64_t n = std::min(k, S);
      std::rotate(row, row + n, row + S);
      std::fill(row + (S - n), row + S, 0);
    }
  };
  shift(out.tokens);
  shift(out.positions);
  shift(out.labels);
  shift(out.loss_mask);
  return out;
}

void MtpUnit::forward(const PassContext& c, Buf e, const Buf& h, Buf& x, Stash& s) const {
  const int64_t Tl = c.Tl, w = c.D.h;
  s.e = std::move(e);
  s.h = h;
  Buf en(sz(Tl * w)), hn(sz(Tl * w));
  s.e_mean.resize(sz(Tl));
  s.e_rstd.resize(sz(Tl));
  s.h_mean.resize(sz(Tl));
  s.h_rstd.resize(sz(Tl));
  c.norm_forward(en.data(), s.e_mean.data(), s.e_rstd.data(), s.e.data(), p->enorm_w, p->enorm_b, Tl, w);
  c.norm_forward(hn.data(), s.h_mean.data(), s.h_rstd.data(), s.h.data(), p->hnorm_w, p->hnorm_b, Tl, w);
  s.cat.resize(sz(Tl * 2 * w));  // [enorm(e) | hnorm(h)] per token, Megatron's order
  for (int64_t i = 0; i < Tl; ++i) {
    std::copy_n(en.begin() + i * w, w, s.cat.begin() + i * 2 * w);
    std::copy_n(hn.begin() + i * w, w, s.cat.begin() + i * 2 * w + w);
  }
  x.resize(sz(Tl * w));
  linear_forward(x.data(), s.cat.data(), c.P(p->eh_proj_w), nullptr, Tl, 2 * w, w);
}

void MtpUnit::backward(const PassContext& c, const Buf& dx, Buf& de, Buf& dh, Stash& s) const {
  const int64_t Tl = c.Tl, w = c.D.h;
  Buf dcat(sz(Tl * 2 * w));
  linear_backward_input(dcat.data(), dx.data(), c.P(p->eh_proj_w), Tl, 2 * w, w);
  c.weight_grad(dx.data(), Tl * w, [&c, &s, this, Tl, w](const float* dy) {
    linear_backward_weight(c.G(p->eh_proj_w), nullptr, dy, s.cat.data(), Tl, 2 * w, w);
  });
  Buf den(sz(Tl * w)), dhn(sz(Tl * w));
  for (int64_t i = 0; i < Tl; ++i) {
    std::copy_n(dcat.begin() + i * 2 * w, w, den.begin() + i * w);
    std::copy_n(dcat.begin() + i * 2 * w + w, w, dhn.begin() + i * w);
  }
  de.resize(sz(Tl * w));
  dh.resize(sz(Tl * w));
  c.norm_backward(de.data(), den.data(), s.e.data(), s.e_mean.data(), s.e_rstd.data(), p->enorm_w, p->enorm_b, Tl, w);
  c.norm_backward(dh.data(), dhn.data(), s.h.data(), s.h_mean.data(), s.h_rstd.data(), p->hnorm_w, p->hnorm_b, Tl, w);
}

}  // namespace mt::cpu
