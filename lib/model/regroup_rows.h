// regroup_rows.h: the block moves of the token dispatch's reordering, shared by both engines' expert parallelism. Rows
// come in blocks (a, b), block (a, b) of counts[a][b] rows; one order has a outer (e.g. by source EP rank, as an
// all-to-all delivers them), the other b outer (by local expert, as the experts' GEMMs read them).
#pragma once

#include <cstdint>
#include <vector>

namespace mt {

struct RowBlockMove {
  int64_t from = 0, to = 0, rows = 0;  // first row in the source order, first row in the destination order, rows
};

// The moves from a-outer order to b-outer order (inverse: back), empty blocks left out.
inline std::vector<RowBlockMove> regroup_moves(const std::vector<std::vector<int64_t>>& counts, bool inverse) {
  const size_t A = counts.size(), B = A ? counts[0].size() : 0;
  std::vector<std::vector<int64_t>> a_outer(A, std::vector<int64_t>(B)), b_outer(A, std::vector<int64_t>(B));
  int64_t at = 0;
  for (size_t a = 0; a < A; ++a) {
    for (size_t b = 0; b < B; ++b) {
      a_outer[a][b] = at;
      at += counts[a][b];
    }
  }
  at = 0;
  for (size_t b = 0; b < B; ++b) {
    for (size_t a = 0; a < A; ++a) {
      b_outer[a][b] = at;
      at += counts[a][b];
    }
  }
  std::vector<RowBlockMove> moves;
  for (size_t a = 0; a < A; ++a) {
    for (size_t b = 0; b < B; ++b) {
      if (counts[a][b] == 0) continue;
      moves.push_back({inverse ? b_outer[a][b] : a_outer[a][b], inverse ? a_outer[a][b] : b_outer[a][b], counts[a][b]});
    }
  }
  return moves;
}

// Expert-TP's gather (the CUDA engine's gpt_cuda_expert_tensor_parallel.cpp): rank a's rows, counts[a][b] for local
// expert b, sit in a block of `block` rows starting at a x block (block: at least every rank's total); the moves from
// those blocks to the expert-major order (to_experts) or back, the blocks' unused rows left out.
inline std::vector<RowBlockMove> padded_block_moves(const std::vector<std::vector<int64_t>>& counts, int64_t block, bool to_experts) {
  // (each rank's unused rows as a last column, which lands after every expert's rows in the expert-major order)
  std::vector<std::vector<int64_t>> padded = counts;
  int64_t real = 0;
  for (auto& a : padded) {
    int64_t n = 0;
    for (int64_t c : a) n += c;
    real += n;
    a.push_back(block - n);
  }
  std::vector<RowBlockMove> moves;
  for (const RowBlockMove& m : regroup_moves(padded, !to_experts)) {
    if ((to_experts ? m.to : m.from) < real) moves.push_back(m);
  }
  return moves;
}

}  // namespace mt
