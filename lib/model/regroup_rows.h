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

}  // namespace mt
