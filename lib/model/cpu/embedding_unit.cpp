// embedding_unit.cpp: the vocab-parallel token embedding (summed over TP, scattered over tokens under SP),
// learned positions and the embedding's dropout on the CPU engine.
#include <cstring>

#include "kernels/cpu/embedding.h"
#include "model/cpu/units.h"

namespace mt::cpu {

void EmbeddingUnit::forward(const PassContext& c, Buf& x) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h;
  Buf full(static_cast<size_t>(T * h));
  x.resize(static_cast<size_t>(Tl * h));
  embedding_forward(full.data(), c.mb.tokens.data(), nullptr, c.P(word), nullptr, T, h, D.tp_rank * D.V_local, D.V_local);
  c.reduce_tokens(full.data(), x.data());
  if (position != kNoParam) {
    const float* wpe = c.P(position);
    for (int64_t i = 0; i < Tl; ++i) {
      const float* pr = wpe + static_cast<int64_t>(c.mb.positions[static_cast<size_t>(c.t0 + i)]) * h;
      for (int64_t j = 0; j < h; ++j) x[static_cast<size_t>(i * h + j)] += pr[j];
    }
  }
  c.dropout_tokens(x.data(), dropout_layer, kDropEmbedding, false);
}

void EmbeddingUnit::backward(const PassContext& c, Buf& dx) const {
  const ModelDims& D = c.D;
  c.dropout_tokens(dx.data(), dropout_layer, kDropEmbedding, true);
  // Only parameter gradients from here: the weight-gradient half of the backward.
  c.weight_grad(dx.data(), c.Tl * D.h, [this, &c](const float* dy) {
    const int64_t T = c.T, Tl = c.Tl, h = c.D.h;
    if (position != kNoParam) {
      float* dwpe = c.G(position);
      for (int64_t i = 0; i < Tl; ++i) {
        float* pr = dwpe + static_cast<int64_t>(c.mb.positions[static_cast<size_t>(c.t0 + i)]) * h;
        for (int64_t j = 0; j < h; ++j) pr[j] += dy[i * h + j];
      }
      if (sums_positions) c.sum_replicated_grads(position, position + 1);
    }
    Buf full(static_cast<size_t>(T * h));
    c.gather_tokens(dy, full.data());
    embedding_backward(c.G(word), nullptr, full.data(), c.mb.tokens.data(), nullptr, T, h, c.D.tp_rank * c.D.V_local, c.D.V_local);
  });
}

}  // namespace mt::cpu
