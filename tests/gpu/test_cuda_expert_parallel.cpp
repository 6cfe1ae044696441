// test_cuda_expert_parallel.cpp: the CUDA model's expert parallelism (model/cuda/gpt_cuda_expert_parallel.cpp) on one
// GPU. The EP ranks run as threads of one process, each with its own model (its share of the experts), stream and
// two microbatches, linked by in-process collectives (thread_collectives.h). One model with every expert runs the ranks'
// microbatches one after another; the EP ranks' gradients summed (the dense ones over the ranks, each expert's from
// the rank that holds it) and their losses summed must be that model's (bf16 tolerance): the counts exchanged, the
// rows' order through both all-to-alls, each expert's rows from every rank, the combine and the backward's way back.
// With TP too (EP x TP threads). The NCCL all-to-alls themselves (the engine's) need 2+ GPUs. Exit 77 (skipped) where
// no GPU is visible.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_check.h"
#include "rank_run.h"
#include "thread_collectives.h"
#include "config/cli.h"
#include "config/resolve.h"
#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "tensor/device_info.h"
#include "train/train_common.h"

namespace {

using mt::test::check;
using mt::test::download;
using mt::test::failures;
using mt::test::RankRun;
using mt::test::rel_err;

// The ranks: TP x DP, folded into expert-TP x EP x expert-DP (Megatron's MoE parallel folding; expert-TP = TP and EP =
// DP unless given).
struct Grid {
  int64_t ep = 1, tp = 1, etp = -1, dp = -1;
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  int64_t data() const { return dp > 0 ? dp : ep; }
  int64_t ranks() const { return tp * data(); }
  int64_t expert_data() const { return ranks() / (expert_tp() * ep); }
};

// A tiny Mixtral-style model (llama: RMSNorm, SwiGLU experts, RoPE, GQA; gpt: LayerNorm, GELU experts, learned
// positions) with 8 experts, top-2, an aux loss and a z-loss, on the grid's ranks (one rank: Grid{}).
// model "gpt-bias": gpt with biases (the router's, the experts' fc1 and fc2).
mt::Config make_config(const std::string& model, const Grid& grid, const std::string& extra) {
  const int64_t ep = grid.ep, tp = grid.tp;
  std::string flags =
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2 "
      "--lr 1e-3 --vocab-size 250 --attention-dropout 0 --hidden-dropout 0 --eval-iters 0 --train-iters 1 --seed 11 --bf16 --mock-data " +
      std::string(model == "gpt-bias" ? "" : "--disable-bias-linear ") +
      "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 96 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 " + extra;
  flags += " --global-batch-size " + std::to_string(2 * grid.data()) + " ";
  if (model == "llama") {
    flags += "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2 "
             "--untie-embeddings-and-output-weights ";
  }
  if (ep > 1) flags += "--expert-model-parallel-size " + std::to_string(ep) + " ";
  // (the vocabulary padded to 256 on every TP size, as on the one model: Megatron pads to a multiple of 128 x TP)
  if (tp > 1) flags += "--tensor-model-parallel-size " + std::to_string(tp) + " --sequence-parallel --make-vocab-size-divisible-by " + std::to_string(128 / tp) + " ";
  if (grid.expert_tp() != tp) flags += "--expert-tensor-parallel-size " + std::to_string(grid.expert_tp()) + " ";
  CLI::App app;
  mt::ConfigCli cli(app);
  app.parse(flags, false);
  mt::Config c = cli.build();
  mt::resolve(c, static_cast<int>(grid.ranks()));
  return c;
}

// The grid's ranks as threads: thread i is TP rank i % TP of DP replica i / TP (its own microbatches), and in the expert
// grid expert-TP rank i % expert-TP, EP rank (i / expert-TP) % EP (the EP group joins the threads of one expert-TP rank
// and expert-DP replica). With expert-TP = TP (EP = DP) the rows exchanged are the TP group's gathered rows and the
// outputs partial sums; with another expert-TP each TP rank's experts take its own slice of the rows, gathered over
// the expert-TP group (gpt_cuda_expert_tensor_parallel.cpp).
void test_expert_parallel(const std::string& model, const Grid& grid, const std::string& extra = "") {
  const int64_t ep = grid.ep, tp = grid.tp, etp = grid.expert_tp(), dp = grid.data();
  char name[300];
  std::snprintf(name, sizeof(name), "expert parallelism %s EP %lld%s%s%s %s(ranks as threads, one GPU)", model.c_str(), static_cast<long long>(ep),
                tp > 1 ? (" x TP " + std::to_string(tp)).c_str() : "", etp != tp ? (" expert-TP " + std::to_string(etp)).c_str() : "",
                dp != ep ? (" DP " + std::to_string(dp)).c_str() : "", extra.c_str());
  try {
    const mt::Config one_cfg = make_config(model, Grid{}, extra), grid_cfg = make_config(model, grid, extra);
    auto data = mt::open_training_data(one_cfg);
    const int64_t mbs = *one_cfg.training.micro_batch_size, S = *one_cfg.data.seq_length;
    // Two microbatches per rank (rank r's are 2r and 2r + 1, or 0 and 1 on every rank, below): the second one's rows reuse, or grow, the first one's
    // buffers (tight, MEGATRAIN_TEST_TIGHT_BUFFERS=1 in main, so that they grow whenever more rows arrive).
    constexpr int64_t kPerRank = 2;
    // Tensorwise FP8: every DP rank takes the same two microbatches. An expert's tensorwise scales come from the rows it
    // takes at once, under EP every EP rank's microbatch of the step: with other microbatches on the ranks than on the
    // one model they are other scales (seen in the thirty-fourth session: one expert whose rows from the two ranks differ
    // in range, its FP8 gradients 2.5 times as far from bf16's as the one model's), with the same ones the same scales.
    const bool same_on_ranks = extra.find("--fp8-recipe tensorwise") != std::string::npos;
    std::vector<mt::Microbatch> mbs_of(static_cast<size_t>(dp * kPerRank));
    double denom = 0;
    for (size_t i = 0; i < mbs_of.size(); ++i) {
      const int64_t sample = static_cast<int64_t>(same_on_ranks ? i % kPerRank : i) * mbs;
      mbs_of[i] = mt::make_microbatch(*data, mt::Split::kTrain, sample, mbs, S, one_cfg);
      for (float x : mbs_of[i].loss_mask) denom += x;
    }
    const auto w = static_cast<float>(1.0 / std::max(denom, 1.0));
    // Every microbatch on one model with every expert, the gradients and losses accumulating.
    const auto run_all = [&](RankRun& run, const mt::Config& cfg) {
      mt::test::prepare(run, cfg, mbs_of[0], mt::LayoutCoordinates{});
      for (size_t i = 0; i < mbs_of.size(); ++i) {
        if (i > 0) mt::test::stage(run, cfg, mbs_of[i]);
        run.dev.aux_grad_scale = 1.0f;
        mt::test::forward_backward(run, w);
      }
    };
    RankRun one;
    run_all(one, one_cfg);
    const std::vector<float> g_one = download(one.model->grads(), static_cast<size_t>(one.model->numel()));
    const float loss_one = download(one.acc, 1)[0];
    // FP8: the same microbatches on the one model in bf16, for what FP8's quantisation itself does to each gradient. (An
    // expert's tensorwise scales come from the rows it takes at once: on the one model one microbatch's, under EP every
    // EP rank's microbatch of that step, so the EP ranks quantise with other scales than the one model.)
    std::vector<float> g_plain;
    if (one.model->dims().fp8) {
      RankRun plain;
      run_all(plain, make_config(model, Grid{}, mt::test::without_fp8_flags(extra)));
      const std::vector<float> g = download(plain.model->grads(), static_cast<size_t>(plain.model->numel()));
      g_plain.assign(g_one.size(), 0.0f);  // (at the FP8 model's offsets, by name)
      for (const mt::ParamInfo& p : plain.store.infos()) {
        const mt::ParamInfo& q = one.store.info(one.store.index_of(p.name));
        std::copy(g.begin() + p.offset, g.begin() + p.offset + p.numel, g_plain.begin() + q.offset);
      }
      mt::test::release(plain);
    }
    // The ranks, each built, run and checked in its own thread.
    const auto n = static_cast<size_t>(grid.ranks());
    if (static_cast<int64_t>(n) % (etp * ep) != 0) throw std::logic_error("the expert grid does not divide the ranks");
    const auto tp_rank = [&](size_t i) { return static_cast<int64_t>(i) % tp; };
    const auto dp_rank = [&](size_t i) { return static_cast<int64_t>(i) / tp; };
    const auto etp_rank = [&](size_t i) { return static_cast<int64_t>(i) % etp; };
    const auto ep_rank = [&](size_t i) { return static_cast<int64_t>(i) / etp % ep; };
    const auto ep_group = [&](size_t i) { return static_cast<size_t>(etp_rank(i) + etp * (static_cast<int64_t>(i) / (etp * ep))); };
    mt::test::Baton baton;
    std::vector<std::unique_ptr<mt::test::ThreadGroup>> ep_groups, tp_groups, etp_groups;
    for (size_t g = 0; g < n / static_cast<size_t>(ep); ++g) ep_groups.push_back(std::make_unique<mt::test::ThreadGroup>(baton, static_cast<int>(ep)));
    for (size_t g = 0; g < n / static_cast<size_t>(tp); ++g) tp_groups.push_back(std::make_unique<mt::test::ThreadGroup>(baton, static_cast<int>(tp)));
    for (size_t g = 0; g < n / static_cast<size_t>(etp); ++g) etp_groups.push_back(std::make_unique<mt::test::ThreadGroup>(baton, static_cast<int>(etp)));
    std::vector<RankRun> ranks(n);
    std::vector<std::unique_ptr<mt::test::ThreadCollectives>> ep_of(n), tp_of(n), etp_of(n);
    for (size_t i = 0; i < n; ++i) {
      ep_of[i] = std::make_unique<mt::test::ThreadCollectives>(*ep_groups[ep_group(i)], static_cast<int>(ep_rank(i)));
      tp_of[i] = std::make_unique<mt::test::ThreadCollectives>(*tp_groups[static_cast<size_t>(dp_rank(i))], static_cast<int>(tp_rank(i)));
      etp_of[i] = std::make_unique<mt::test::ThreadCollectives>(*etp_groups[i / static_cast<size_t>(etp)], static_cast<int>(etp_rank(i)));
    }
    mt::test::run_ranks(baton, n, [&](size_t i) {
      const int64_t d = dp_rank(i);
      mt::LayoutCoordinates at;
      at.ep_rank = ep_rank(i);
      at.ep_size = ep;
      at.tp_rank = tp_rank(i);
      at.tp_size = tp;
      at.etp_rank = etp_rank(i);
      at.etp_size = etp;
      mt::test::prepare(ranks[i], grid_cfg, mbs_of[static_cast<size_t>(d * kPerRank)], at, tp > 1 ? tp_of[i].get() : nullptr);
      if (ep > 1) ranks[i].model->set_expert_parallel(ep_of[i].get());
      if (etp != tp && etp > 1) ranks[i].model->set_expert_tensor_parallel(etp_of[i].get());
      for (int64_t k = 0; k < kPerRank; ++k) {
        if (k > 0) mt::test::stage(ranks[i], grid_cfg, mbs_of[static_cast<size_t>(d * kPerRank + k)]);
        ranks[i].dev.aux_grad_scale = 1.0f;
        mt::test::forward_backward(ranks[i], w, k == kPerRank - 1);
      }
    });
    // The ranks' gradients at the one model's places: the dense parameters summed over the DP replicas (each one's share
    // of the tokens), each expert shard over the expert-DP replicas that hold it (each one's rows); every expert shard
    // must be held by expert-DP ranks. Under TP each shard goes to its global place, and what TP replicates is taken
    // from TP rank 0 (the other TP ranks' copies must equal it: the router's gradient summed over TP).
    std::vector<float> g_sum(g_one.size(), 0.0f);
    std::vector<int> holders(one.store.infos().size(), 0);
    float loss_sum = 0;
    double tp_copies_gap = 0;
    for (size_t i = 0; i < n; ++i) {
      RankRun& run = ranks[i];
      const bool tp_lead = tp_rank(i) == 0, etp_lead = etp_rank(i) == 0;
      const std::vector<float> g = download(run.model->grads(), static_cast<size_t>(run.model->numel()));
      for (const mt::ParamInfo& p : run.store.infos()) {
        if (!p.trainable || p.replica > 0) continue;
        const size_t at = one.store.index_of(p.name);
        const mt::ParamInfo& one_p = one.store.info(at);
        if (p.global_shape != one_p.global_shape) throw std::logic_error(p.name + ": a rank's global shape differs from the one model's");
        if (p.grad_group == mt::GradGroup::kExpert) {  // (whole on every expert-TP rank where unsharded: counted once)
          if (p.shard_dim < 0 && !etp_lead) continue;
          if (etp_lead) ++holders[at];
          for (int64_t e = 0; e < p.numel; ++e) {
            g_sum[static_cast<size_t>(one_p.offset + mt::test::global_index(p, e))] += g[static_cast<size_t>(p.offset + e)];
          }
          continue;
        }
        if (p.shard_dim < 0 && !tp_lead) {
          RankRun& lead = ranks[i - i % static_cast<size_t>(tp)];
          const mt::ParamInfo& p0 = lead.store.info(lead.store.index_of(p.name));
          const std::vector<float> g0 = download(lead.model->grads() + p0.offset, static_cast<size_t>(p0.numel));
          tp_copies_gap = std::max(tp_copies_gap, rel_err(std::vector<float>(g.begin() + p.offset, g.begin() + p.offset + p.numel), g0));
          continue;
        }
        if (tp_lead) ++holders[at];
        for (int64_t e = 0; e < p.numel; ++e) {
          g_sum[static_cast<size_t>(one_p.offset + mt::test::global_index(p, e))] += g[static_cast<size_t>(p.offset + e)];
        }
      }
      if (tp_lead) loss_sum += download(run.acc, 1)[0];
    }
    double worst = 0, fp8_excess = 0;  // (FP8: the largest gap over max(3e-2, 2 x FP8's own effect on the parameter))
    std::string worst_name, excess_name, over;  // (over: every tensor past its bound, printed when the check fails)
    int64_t experts_checked = 0;
    for (size_t i = 0; i < one.store.infos().size(); ++i) {
      const mt::ParamInfo& p = one.store.info(i);
      if (!p.trainable) continue;
      const bool expert = p.grad_group == mt::GradGroup::kExpert;
      if (holders[i] != static_cast<int>(expert ? grid.expert_data() : dp)) {
        throw std::logic_error(p.name + ": held by " + std::to_string(holders[i]) + (expert ? " expert-DP ranks" : " DP ranks"));
      }
      experts_checked += expert ? 1 : 0;
      const std::vector<float> a(g_sum.begin() + p.offset, g_sum.begin() + p.offset + p.numel), b(g_one.begin() + p.offset, g_one.begin() + p.offset + p.numel);
      const double e = rel_err(a, b);
      if (g_plain.empty() && !(e < 3e-2)) over += "\n    " + p.name + " " + std::to_string(e);
      if (e > worst || !std::isfinite(e)) {
        worst = e;
        worst_name = p.name;
      }
      if (!g_plain.empty()) {  // (the one model in bf16 has the same layout: the same offsets)
        const std::vector<float> c(g_plain.begin() + p.offset, g_plain.begin() + p.offset + p.numel);
        const double excess = e / std::max(3e-2, 2.0 * rel_err(b, c));
        if (!(excess < 1.0)) {
          over += "\n    " + p.name + " " + std::to_string(e) + " (FP8 against bf16 " + std::to_string(rel_err(b, c)) + ", these ranks' FP8 against bf16 " +
                  std::to_string(rel_err(a, c)) + ")";
        }
        if (excess > fp8_excess || !std::isfinite(excess)) {
          fp8_excess = excess;
          excess_name = p.name + " (FP8 against bf16 " + std::to_string(rel_err(b, c)) + ")";
        }
      }
    }
    if (experts_checked == 0) throw std::logic_error("no expert parameters were compared");
    const double loss_gap = std::fabs(loss_sum - loss_one) / std::fabs(loss_one);
    char buf[800];
    std::snprintf(buf, sizeof(buf), "%s: loss %.6f (one model %.6f, %.2e apart); worst parameter gradient %s %.2e from the one model's (%lld expert tensors)%s%s",
                  name, loss_sum, loss_one, loss_gap, worst_name.c_str(), worst, static_cast<long long>(experts_checked),
                  tp > 1 ? ("; TP copies " + std::to_string(tp_copies_gap) + " apart").c_str() : "",
                  g_plain.empty() ? "" : ("; nearest its FP8 bound: " + excess_name).c_str());
    // (FP8: each gradient within twice what FP8's quantisation does to it, as test_cuda_context_parallel's TP cases, and
    // the loss within FP8's tolerance there)
    const bool grads_ok = g_plain.empty() ? worst < 3e-2 : fp8_excess < 1.0;
    const bool ok = loss_gap < (g_plain.empty() ? 2e-3 : 5e-3) && grads_ok && std::isfinite(worst) && tp_copies_gap < 1e-5;
    check(ok, buf);
    if (!ok && !over.empty()) std::printf("  the tensors past their bound:%s\n", over.c_str());
    for (RankRun& run : ranks) mt::test::release(run);
    mt::test::release(one);
  } catch (const std::exception& e) {
    check(false, std::string(name) + ": " + e.what());
  }
}

}  // namespace

int main() {
  setenv("MEGATRAIN_TEST_TIGHT_BUFFERS", "1", 1);  // (read once, at the first growth)
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible (%s)\n", mt::gpu_unavailable_reason().c_str());
    return 77;
  }
  test_expert_parallel("llama", {2});
  test_expert_parallel("llama", {4});
  test_expert_parallel("gpt", {2});  // GELU experts (the GEMM's epilogue)
  test_expert_parallel("llama", {8}, "--moe-shared-expert-intermediate-size 64 ");  // one expert per rank, and the shared expert beside them
  // The dispatch again in the backward's recompute (the same counts and rows as the forward's).
  test_expert_parallel("llama", {2}, "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ");
  // --recompute-modules moe_act: the experts' activations of the rows that arrived, in one growing buffer the layers share,
  // computed again before each layer's expert backward (SwiGLU; GELU with expert-TP's rows over TP 2).
  test_expert_parallel("llama", {4}, "--recompute-granularity selective --recompute-modules moe_act ");
  // A capacity that drops, and padding to capacity: each rank's kept and padding rows, in owner order, cross the ranks.
  test_expert_parallel("llama", {2}, "--moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall ");
  test_expert_parallel("llama", {4}, "--moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall --moe-pad-expert-input-to-capacity ");
  // Group-limited routing and sigmoid scores with an expert bias: the routing is each rank's own; the dispatch the same.
  // Biases (each expert's from the rows it received), and squared ReLU experts.
  test_expert_parallel("gpt-bias", {2});
  test_expert_parallel("gpt", {2}, "--squared-relu ");
  test_expert_parallel("gpt", {4}, "--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-num-groups 4 --moe-router-group-topk 2 ");
  // EP x TP (the experts' shards over expert-TP = TP): the TP group's gathered rows cross the EP ranks of one TP rank.
  // Every expert chosen (top-8 of 8): the TP layers' attention rounds differently from one model's, which can flip a
  // near-tie of the top-k (test_cuda_context_parallel's TP cases measured it).
  test_expert_parallel("llama", {2, 2}, "--moe-router-topk 8 ");
  test_expert_parallel("gpt", {2, 2}, "--moe-router-topk 8 --moe-shared-expert-intermediate-size 64 ");
  // Expert-TP other than TP (Megatron's MoE parallel folding): each TP rank's experts take its own slice of the rows,
  // routed over all of them as before (under TP top-8: every expert chosen, as above), and with an expert-TP group of
  // more than one rank the rows gathered over it. TP 2 = expert-TP 1 x EP 2 (the EP group is the TP group): SwiGLU,
  // GELU with biases, the shared expert, a capacity (dropping by position, so that the TP layers' rounding cannot move
  // a drop), recomputed; with DP 2 (expert-DP 2: each expert's gradient from two ranks' rows; the EP group is not the
  // DP group); TP 4 = expert-TP 2 x EP 2;
  // TP 1 with expert-TP 2 over DP 2 (each rank's rows gathered with the other replica's), with a capacity padded to.
  test_expert_parallel("llama", {.ep = 2, .tp = 2, .etp = 1, .dp = 1}, "--moe-router-topk 8 ");
  test_expert_parallel("gpt-bias", {.ep = 2, .tp = 2, .etp = 1, .dp = 1}, "--moe-router-topk 8 ");
  test_expert_parallel("gpt", {.ep = 2, .tp = 2, .etp = 1, .dp = 1}, "--moe-router-topk 8 --moe-shared-expert-intermediate-size 64 ");
  test_expert_parallel("llama", {.ep = 2, .tp = 2, .etp = 1, .dp = 1},
                       "--moe-router-topk 8 --moe-expert-capacity-factor 0.75 --moe-token-drop-policy position --moe-token-dispatcher-type alltoall ");
  test_expert_parallel("llama", {.ep = 2, .tp = 2, .etp = 1, .dp = 1},
                       "--moe-router-topk 8 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ");
  test_expert_parallel("llama", {.ep = 2, .tp = 2, .etp = 1, .dp = 2}, "--moe-router-topk 8 ");
  test_expert_parallel("gpt", {.ep = 2, .tp = 4, .etp = 2, .dp = 1}, "--moe-router-topk 8 ");  // (GPT: a head per TP rank, no K/V replication)
  // Expert-TP across DP ranks: top-8 (every token at every expert), and top-2 with the router's random logits. (Top-2 by
  // the router fails on the GPU for a reason outside the layout, seen in the thirty-fourth session: the expert-TP partial
  // sums rounded to bf16 apart move one near-tied token's choice in the second layer, so two experts' three tensors there
  // were 0.10 to 0.20 from the one model's and every other tensor within 3e-2; at top-8 within 5.7e-3.)
  test_expert_parallel("llama", {.ep = 1, .tp = 1, .etp = 2, .dp = 2}, "--moe-router-topk 8 ");
  test_expert_parallel("llama", {.ep = 1, .tp = 1, .etp = 2, .dp = 2}, "--moe-router-topk 8 --recompute-granularity selective --recompute-modules moe_act ");
  test_expert_parallel("llama", {.ep = 2, .tp = 1, .etp = 2, .dp = 4}, "--moe-router-topk 8 ");
  test_expert_parallel("llama", {.ep = 1, .tp = 1, .etp = 2, .dp = 2}, "--moe-router-force-load-balancing ");
  test_expert_parallel("llama", {.ep = 1, .tp = 1, .etp = 2, .dp = 2},
                       "--moe-router-force-load-balancing --moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall "
                       "--moe-pad-expert-input-to-capacity ");
  test_expert_parallel("llama", {.ep = 2, .tp = 1, .etp = 2, .dp = 4}, "--moe-router-force-load-balancing ");
  // --moe-router-force-load-balancing: the random logits from each token's place route every rank as the one model (no
  // near-ties from the TP layers' rounding: top-2 under TP too).
  test_expert_parallel("llama", {2}, "--moe-router-force-load-balancing ");
  test_expert_parallel("gpt", {.ep = 2, .tp = 2, .etp = 1, .dp = 1}, "--moe-router-topk 8 --recompute-granularity selective --recompute-modules moe_act ");
  test_expert_parallel("llama", {.ep = 2, .tp = 2, .etp = 1, .dp = 1}, "--moe-router-force-load-balancing ");
  // FP8 in MoE layers under EP (tensorwise and blockwise; delayed scaling is refused with EP): each expert's block of
  // rows padded to 16 where it is routed, the padded blocks (zero rows) crossing the ranks, so the rows that arrive stay
  // 16-aligned per expert; the FP8 buffers grow with them. With the shared expert, recomputed, a capacity (padded to
  // it too), and a bf16 MoE layer in the FP8 model.
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe tensorwise ");
  test_expert_parallel("llama", {4}, "--fp8-format hybrid --fp8-recipe tensorwise --moe-shared-expert-intermediate-size 64 ");
  test_expert_parallel("gpt", {2}, "--fp8-format e4m3 --fp8-recipe tensorwise ");
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe blockwise ");
  // (blockwise scales are each block's own, so these keep other microbatches on each rank: unequal counts from the
  // ranks through FP8's padded blocks, which the tensorwise cases' same microbatches no longer give; added in the
  // thirty-fourth session after its GPU runs)
  test_expert_parallel("llama", {4}, "--fp8-format hybrid --fp8-recipe blockwise --moe-shared-expert-intermediate-size 64 ");
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe blockwise --moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall "
                                     "--moe-pad-expert-input-to-capacity ");
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe tensorwise --recompute-granularity full --recompute-method uniform "
                       "--recompute-num-layers 1 ");
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe tensorwise --moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall ");
  test_expert_parallel("llama", {4}, "--fp8-format hybrid --fp8-recipe tensorwise --moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall "
                       "--moe-pad-expert-input-to-capacity ");
  // (a bf16 MoE layer in an FP8 model: its rows aligned to 16 too, the gaps zero as they travel)
  test_expert_parallel("llama", {2}, "--fp8-format hybrid --fp8-recipe tensorwise --first-last-layers-bf16 --num-layers-at-start-in-bf16 1 "
                       "--num-layers-at-end-in-bf16 0 ");
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
