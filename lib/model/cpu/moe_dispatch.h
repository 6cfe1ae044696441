// moe_dispatch.h: the token dispatcher of the CPU engine's MoE layer: this rank's (token, expert) choices go to
// the ranks holding the experts and the experts' outputs come back, over the expert grid (Megatron's MoE
// parallel folding): EP splits the experts, expert-TP each expert's MLP (its ranks see the rows of all of them,
// all-gathered, and reduce-scatter the partial outputs). Two implementations with the same results:
// alltoall (rows sent by all-to-all with per-rank counts) and allgather (every EP rank gathers the tokens and
// the choices and picks its experts' rows; the weighted outputs come back by reduce-scatter).
#pragma once

#include <cstdint>
#include <vector>

#include "model/cpu/pass_context.h"

namespace mt::cpu {

// One (token, expert) choice of this rank: slot is the top-k slot (-1: a padding row of
// --moe-pad-expert-input-to-capacity, weight 0); sorted by expert, then token.
struct Assignment {
  int64_t token = 0;
  int32_t expert = 0, slot = -1;
  float weight = 0;
};

class TokenDispatcher {
 public:
  // alltoall: --moe-token-dispatcher-type alltoall (else allgather).
  explicit TokenDispatcher(bool alltoall) : alltoall_(alltoall) {}
  // Forward. dispatch: the rows of ln [Tl, h] this rank's choices name go to the experts; `rows` receives the
  // rows this rank's local experts compute (expert-major; expert-TP: those of the whole expert-TP group) and
  // `per_expert` their counts. combine: the experts' outputs `y` (same rows; expert-TP partial sums) come back
  // and out[Tl, h] = sum over each token's choices of weight * y.
  void dispatch(const PassContext& c, const std::vector<Assignment>& mine, const float* ln, Buf& rows, std::vector<int64_t>& per_expert);
  void combine(const PassContext& c, const Buf& y, Buf& out);
  // Backward. combine_backward: from dout [Tl, h], the experts' output gradients dy (rows as dispatched) and
  // the gradient of each choice's weight dweight[Tl, k] (overwritten; 0 for dropped choices).
  // dispatch_backward: the experts' input gradients dx (expert-TP partial sums) back to dln [Tl, h] (added).
  void combine_backward(const PassContext& c, const Buf& dout, Buf& dy, Buf& dweight);
  void dispatch_backward(const PassContext& c, const Buf& dx, Buf& dln);

 private:
  // Expert-TP: the group's rows of each local expert gathered (expert-major), and the partial sums scattered back.
  void gather_expert_tp(const PassContext& c, const Buf& local_rows, Buf& rows) const;
  void scatter_expert_tp(const PassContext& c, const Buf& rows, Buf& local_rows) const;
  // EP all-to-all of assignment rows: owner order (by destination rank) <-> this rank's experts (expert-major).
  void owners_to_experts(const PassContext& c, const Buf& owner_rows, Buf& expert_rows) const;
  void experts_to_owners(const PassContext& c, const Buf& expert_rows, Buf& owner_rows) const;

  bool alltoall_;
  int64_t Tl_ = 0, h_ = 0;
  std::vector<Assignment> mine_;
  // alltoall: rows per (source EP rank, local expert) received, and what each rank sends / receives.
  std::vector<std::vector<int64_t>> from_source_;
  std::vector<int64_t> send_counts_, recv_counts_;
  // allgather: the rows this rank's experts take: (source EP rank, index into that rank's tokens, slot, weight).
  struct Picked {
    int64_t source = 0, token = 0;
    int32_t slot = -1;
    float weight = 0;
  };
  std::vector<Picked> picked_;
  // expert-TP: rows per (expert-TP rank, local expert), this rank's local rows per expert.
  std::vector<std::vector<int64_t>> etp_counts_;
  std::vector<int64_t> local_per_expert_;
  Buf owner_y_;      // alltoall: the outputs of this rank's choices (unweighted), in `mine_` order
  Buf picked_y_;     // allgather: the outputs of the picked rows (unweighted, summed over expert-TP)
};

}  // namespace mt::cpu
