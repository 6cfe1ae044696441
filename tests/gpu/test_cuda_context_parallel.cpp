// test_cuda_context_parallel.cpp: the CUDA model's context parallelism (model/cuda/gpt_cuda_context.cpp) on one GPU,
// alone and with tensor parallelism, with dense and MoE layers; and TP alone, in FP8 too, and with multi-latent attention. The ranks run as threads of one process, each with its own model and stream,
// linked by in-process collectives (thread_collectives.h). Each rank forwards and backwards its
// two chunks of every sequence (context_parallel_slice); the ranks' gradients summed and their losses summed must be
// the whole sequence's on one model (bf16 tolerance): the ring's order, the block kinds, the travelling K/V gradients,
// the positions; and for --cp-comm-type a2a the all-to-alls' layouts (an in-process all-to-all). The NCCL collectives
// themselves (the engine's) need 2+ GPUs. Exit 77 (skipped) where no GPU is visible.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "device_buffers.h"
#include "gpu_check.h"
#include "rank_run.h"
#include "thread_collectives.h"
#include "config/cli.h"
#include "config/resolve.h"
#include "model/context_parallel.h"
#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "tensor/device_info.h"
#include "train/microbatch_staging.h"
#include "train/train_common.h"

namespace {

using mt::test::check;
using mt::test::download;
using mt::test::failures;
using mt::test::forward_backward;
using mt::test::global_index;
using mt::test::prepare;
using mt::test::rel_err;
using mt::test::release;
using mt::test::RankRun;

// The MoE aux and z losses' gradient scale (the engine's share of the step; any value both sides use).
constexpr float kAuxGradScale = 0.25f;

mt::LayoutCoordinates tp_coordinates(int64_t tp_rank, int64_t tp_size) {
  mt::LayoutCoordinates at;
  at.tp_rank = tp_rank;
  at.tp_size = tp_size;
  at.etp_rank = tp_rank;  // (MoE: the experts split over expert-TP = TP, Megatron's default)
  at.etp_size = tp_size;
  return at;
}

mt::Config make_config(const std::string& model, int64_t tp, int64_t cp, const std::string& comm, const std::string& extra) {
  std::string flags =
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
      "--lr 1e-3 --vocab-size 250 --attention-dropout 0 --eval-iters 0 --train-iters 1 --seed 11 --bf16 "
      "--mock-data " + extra;
  if (extra.find("--hidden-dropout") == std::string::npos) flags += " --hidden-dropout 0 ";
  if (extra.find("--micro-batch-size") == std::string::npos) flags += " --micro-batch-size 2 --global-batch-size 2 ";
  if (model == "llama") {
    flags += "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2 "
             "--untie-embeddings-and-output-weights --disable-bias-linear ";
  }
  if (model == "llama-recompute") {
    flags += "--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2 "
             "--untie-embeddings-and-output-weights --disable-bias-linear --recompute-granularity full --recompute-method uniform "
             "--recompute-num-layers 1 ";
  }
  if (model == "deepseek") flags += mt::test::kDeepseekFlags;  // (multi-latent attention, no CP on the CUDA engine: gpu_check.h)
  if (model == "deepseek-gpt") flags += mt::test::kDeepseekGptFlags;
  if (cp > 1) flags += "--context-parallel-size " + std::to_string(cp) + " --cp-comm-type " + comm + " ";
  if (tp > 1) flags += "--tensor-model-parallel-size " + std::to_string(tp) + " ";
  else if (extra.find("--sequence-parallel") != std::string::npos) flags.erase(flags.find("--sequence-parallel"), 19);  // (the whole model: TP 1)
  CLI::App app;
  mt::ConfigCli cli(app);
  app.parse(flags, false);
  mt::Config c = cli.build();
  mt::resolve(c, static_cast<int>(tp * cp));
  return c;
}

// TP x CP ranks as threads (thread (t, c): TP rank t of TP group c, CP rank c of CP group t) against the whole
// sequences on one model: the gradients of the TP shards put at their global places and summed over CP (a parameter
// TP replicates taken from TP rank 0), the loss summed over CP.
// FP8 delayed scaling: one microbatch's forward and backward first, so that the measured one casts with scales from an
// amax history (the first iteration's scales of 1 leave most output gradients below E5M2's normal range), then the
// gradients and the loss zeroed again. A no-op for other models.
void delayed_scaling_warm_up(RankRun& run, float w) {
  if (!run.model->fp8_delayed()) return;
  forward_backward(run, w);
  cudaMemsetAsync(run.model->grads(), 0, static_cast<size_t>(run.model->numel()) * 4, run.stream);
  cudaMemsetAsync(run.acc, 0, 4, run.stream);
  if (cudaStreamSynchronize(run.stream) != cudaSuccess) throw std::runtime_error("the model's stream failed");
}

// MT_GPU_TEST_ONLY=fp8: only the FP8 cases; =mla: only multi-latent attention's.
bool only_fp8 = false, only_mla = false;

void test_context_parallel(const std::string& model, int64_t cp, const std::string& comm = "p2p", const std::string& extra = "", int64_t tp = 1) {
  if (only_fp8 && extra.find("--fp8-format") == std::string::npos) return;
  if (only_mla && model.rfind("deepseek", 0) != 0) return;
  char name[220];
  std::snprintf(name, sizeof(name), "context parallelism %s CP %lld %s%s %s(ranks as threads, one GPU)", model.c_str(), static_cast<long long>(cp),
                comm.c_str(), tp > 1 ? (" x TP " + std::to_string(tp)).c_str() : "", extra.c_str());
  try {
    const mt::Config whole_cfg = make_config(model, 1, 1, comm, extra), grid_cfg = make_config(model, tp, cp, comm, extra);
    auto data = mt::open_training_data(whole_cfg);
    mt::Microbatch mb = mt::make_microbatch(*data, mt::Split::kTrain, 0, *whole_cfg.training.micro_batch_size, *whole_cfg.data.seq_length, whole_cfg);
    if (whole_cfg.data.reset_attention_mask) {
      // Megatron's mock documents are longer than these sequences: documents of 5 to 60 tokens instead, each token's
      // document start and (--reset-position-ids) its position in its document, as the data loader makes them.
      uint64_t state = 12345;
      for (int64_t b = 0; b < mb.B; ++b) {
        int64_t start = 0;
        for (int64_t s = 0; s < mb.S; ++s) {
          if (s > start && s - start >= 5 + static_cast<int64_t>(state % 56)) {
            start = s;
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
          }
          const auto t = static_cast<size_t>(b * mb.S + s);
          mb.row_start[t] = static_cast<int32_t>(start);
          if (whole_cfg.data.reset_position_ids) mb.positions[t] = static_cast<int32_t>(s - start);
        }
      }
    }
    double denom = 0;
    for (float x : mb.loss_mask) denom += x;
    const auto w = static_cast<float>(1.0 / std::max(denom, 1.0));
    // With --reset-attention-mask: the tokens after a document boundary (none would make the check vacuous).
    int64_t in_later_documents = 0;
    for (int32_t x : mb.row_start) in_later_documents += x > 0 ? 1 : 0;
    if (whole_cfg.data.reset_attention_mask && in_later_documents == 0) throw std::runtime_error("the microbatch holds one document per sample");
    // The whole sequences on one model.
    RankRun whole;
    prepare(whole, whole_cfg, mb, tp_coordinates(0, 1));
    whole.dev.aux_grad_scale = kAuxGradScale;
    delayed_scaling_warm_up(whole, w);
    forward_backward(whole, w);
    const std::vector<float> g_whole = download(whole.model->grads(), static_cast<size_t>(whole.model->numel()));
    const float loss_whole = download(whole.acc, 1)[0];
    // The grid: each rank built, run and checked in its own thread (the models' constructors meet over TP too).
    mt::test::Baton baton;
    std::vector<std::unique_ptr<mt::test::ThreadGroup>> tp_groups, cp_groups;
    for (int64_t c = 0; c < cp; ++c) tp_groups.push_back(std::make_unique<mt::test::ThreadGroup>(baton, static_cast<int>(tp)));
    for (int64_t t = 0; t < tp; ++t) cp_groups.push_back(std::make_unique<mt::test::ThreadGroup>(baton, static_cast<int>(cp)));
    const auto n = static_cast<size_t>(tp * cp);
    std::vector<RankRun> ranks(n);
    std::vector<std::unique_ptr<mt::test::ThreadCollectives>> tp_of(n), cp_of(n);
    for (int64_t t = 0; t < tp; ++t) {
      for (int64_t c = 0; c < cp; ++c) {
        const auto i = static_cast<size_t>(c * tp + t);
        tp_of[i] = std::make_unique<mt::test::ThreadCollectives>(*tp_groups[static_cast<size_t>(c)], static_cast<int>(t));
        cp_of[i] = std::make_unique<mt::test::ThreadCollectives>(*cp_groups[static_cast<size_t>(t)], static_cast<int>(c));
      }
    }
    mt::test::run_ranks(baton, n, [&](size_t i) {
      const auto t = static_cast<int64_t>(i) % tp, c = static_cast<int64_t>(i) / tp;
      prepare(ranks[i], grid_cfg, mt::context_parallel_slice(mb, c, cp), tp_coordinates(t, tp), tp > 1 ? tp_of[i].get() : nullptr);
      if (cp > 1) ranks[i].model->set_context_parallel(cp_of[i].get());
      ranks[i].dev.aux_grad_scale = kAuxGradScale;
      delayed_scaling_warm_up(ranks[i], w);
      forward_backward(ranks[i], w);
    });
    std::vector<float> g_sum(g_whole.size(), 0.0f);
    float loss_sum = 0;
    double tp_copies_gap = 0;  // what TP replicates (norms, the loss) differing between the TP ranks
    for (int64_t c = 0; c < cp; ++c) {
      std::vector<float> g0;
      for (int64_t t = 0; t < tp; ++t) {
        RankRun& run = ranks[static_cast<size_t>(c * tp + t)];
        const std::vector<float> g = download(run.model->grads(), static_cast<size_t>(run.model->numel()));
        if (t == 0) g0 = g;
        for (const mt::ParamInfo& p : run.store.infos()) {
          if (p.replica > 0 || !p.trainable) continue;
          const mt::ParamInfo& whole_p = whole.store.info(whole.store.index_of(p.name));
          if (p.global_shape != whole_p.global_shape) throw std::logic_error(p.name + ": the TP ranks' global shape differs from the whole model's");
          if (p.shard_dim < 0 && t > 0) {  // (the same offsets on every TP rank: TP rank 0's copy)
            const mt::ParamInfo& p0 = ranks[static_cast<size_t>(c * tp)].store.info(ranks[static_cast<size_t>(c * tp)].store.index_of(p.name));
            const std::vector<float> a(g.begin() + p.offset, g.begin() + p.offset + p.numel), b(g0.begin() + p0.offset, g0.begin() + p0.offset + p0.numel);
            tp_copies_gap = std::max(tp_copies_gap, rel_err(a, b));
            continue;
          }
          for (int64_t e = 0; e < p.numel; ++e) {
            g_sum[static_cast<size_t>(whole_p.offset + global_index(p, e))] += g[static_cast<size_t>(p.offset + e)];
          }
        }
        const float loss = download(run.acc, 1)[0];
        if (t == 0) loss_sum += loss;
        else tp_copies_gap = std::max(tp_copies_gap, static_cast<double>(std::fabs(loss - download(ranks[static_cast<size_t>(c * tp)].acc, 1)[0])));
      }
    }
    // Per parameter: the worst relative gap.
    double worst = 0;
    std::string worst_name;
    for (const mt::ParamInfo& p : whole.store.infos()) {
      const std::vector<float> a(g_sum.begin() + p.offset, g_sum.begin() + p.offset + p.numel), b(g_whole.begin() + p.offset, g_whole.begin() + p.offset + p.numel);
      const double e = rel_err(a, b);
      if (e > worst) {
        worst = e;
        worst_name = p.name;
      }
    }
    // FP8: the parameters' gaps beside the FP8 quantisation's own effect on each (the whole model in FP8 against itself
    // in bf16), the three largest gaps named in the message.
    std::string fp8_detail;
    double fp8_grad_excess = 0;  // the largest gap over its bound, max(8e-2, 2 x FP8's own effect on that parameter)
    if (whole.model->dims().fp8) {
      RankRun plain;
      prepare(plain, make_config(model, 1, 1, comm, mt::test::without_fp8_flags(extra)), mb, tp_coordinates(0, 1));
      plain.dev.aux_grad_scale = kAuxGradScale;
      forward_backward(plain, w);
      const std::vector<float> g_plain = download(plain.model->grads(), static_cast<size_t>(plain.model->numel()));
      const float loss_plain = download(plain.acc, 1)[0];
      std::string excess_name;
      std::vector<std::pair<double, std::string>> gaps;
      for (const mt::ParamInfo& p : whole.store.infos()) {
        const mt::ParamInfo& q = plain.store.info(plain.store.index_of(p.name));
        const std::vector<float> a(g_sum.begin() + p.offset, g_sum.begin() + p.offset + p.numel), b(g_whole.begin() + p.offset, g_whole.begin() + p.offset + p.numel),
            c(g_plain.begin() + q.offset, g_plain.begin() + q.offset + q.numel);
        char item[200];
        std::snprintf(item, sizeof(item), "%s %.2e (FP8 against bf16 %.2e)", p.name.c_str(), rel_err(a, b), rel_err(b, c));
        gaps.emplace_back(rel_err(a, b), item);
        const double excess = rel_err(a, b) / std::max(8e-2, 2.0 * rel_err(b, c));
        if (excess > fp8_grad_excess) {
          fp8_grad_excess = excess;
          excess_name = item;
        }
      }
      release(plain);
      std::sort(gaps.begin(), gaps.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
      for (size_t i = 0; i < std::min<size_t>(3, gaps.size()); ++i) fp8_detail += (i ? ", " : "; largest gaps: ") + gaps[i].second;
      char tail[300];
      std::snprintf(tail, sizeof(tail), "; nearest its bound: %s; the whole model's loss in FP8 %.2e from bf16's", excess_name.c_str(),
                    std::fabs(loss_whole - loss_plain) / std::fabs(loss_plain));
      fp8_detail += tail;
    }
    // MoE: each rank's statistics per layer (the aux and z losses over the whole sequences: every CP rank's the whole
    // model's) and the tokens its experts kept (summed over CP: the whole model's, every choice of every token).
    double moe_gap = 0;
    const int64_t moe_layers = whole.model->moe_layer_count(), E = whole.model->dims().experts;
    if (moe_layers > 0) {
      const auto row = static_cast<size_t>(whole.model->moe_stats_row()), head = row - static_cast<size_t>(E);
      const std::vector<float> want = download(whole.model->moe_stats(), static_cast<size_t>(moe_layers) * row);
      std::vector<double> kept(static_cast<size_t>(moe_layers), 0.0), kept_whole(static_cast<size_t>(moe_layers), 0.0);
      for (int64_t c = 0; c < cp; ++c) {
        const std::vector<float> got = download(ranks[static_cast<size_t>(c * tp)].model->moe_stats(), want.size());
        for (int64_t l = 0; l < moe_layers; ++l) {
          for (size_t j = 0; j < head; ++j) {
            const float a = got[static_cast<size_t>(l) * row + j], b = want[static_cast<size_t>(l) * row + j];
            if (b != 0.0f) moe_gap = std::max(moe_gap, static_cast<double>(std::fabs(a - b) / std::fabs(b)));
          }
          for (int64_t e = 0; e < E; ++e) {
            kept[static_cast<size_t>(l)] += got[static_cast<size_t>(l) * row + head + static_cast<size_t>(e)];
            if (c == 0) kept_whole[static_cast<size_t>(l)] += want[static_cast<size_t>(l) * row + head + static_cast<size_t>(e)];
          }
        }
      }
      if (kept != kept_whole) throw std::runtime_error("the CP ranks' experts kept another number of tokens than the whole model's");
      if (std::all_of(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(head), [](float v) { return v == 0.0f; })) {
        throw std::runtime_error("no MoE statistics recorded (the check would be vacuous)");  // (the first layer's losses and z)
      }
    }
    // FP8 under TP: every cast's scale the same on every TP rank, bit for bit (each TP shard's amax reduced over TP): the
    // inverse scales the casts last used (tensorwise: the weights' equal to the whole model's too, the max over the shards
    // being exact) and under delayed scaling the amax histories and scales after the iteration's updates; the inputs' and
    // weights' amaxes within rounding of the whole model's (the output gradients', at delayed scaling's first scale of 1,
    // near E5M2's smallest values, are left to the gradients' check).
    double fp8_gap = 0, fp8_ranks_gap = 0;
    std::string fp8_worst;
    const bool fp8 = whole.model->dims().fp8;
    if (fp8) {
      const std::vector<float> want = whole.model->fp8_last_inverse_scales();
      const std::vector<float> first = ranks[0].model->fp8_last_inverse_scales();
      const size_t weights = want.size() / 2;  // (then the inputs')
      for (size_t i = 0; i < n; ++i) {
        const std::vector<float> got = ranks[i].model->fp8_last_inverse_scales();
        for (size_t j = 0; j < got.size(); ++j) {
          fp8_ranks_gap = std::max(fp8_ranks_gap, static_cast<double>(std::fabs(got[j] - first[j])));
          const double gap = j < weights && !whole.model->fp8_delayed() ? (got[j] == want[j] ? 0.0 : 1.0)
                             : want[j] != 0.0f ? static_cast<double>(std::fabs(got[j] - want[j]) / std::fabs(want[j])) : 0.0;
          if (gap > fp8_gap) {
            fp8_gap = gap;
            const size_t k = j < weights ? j : j - weights;
            fp8_worst = std::string(j < weights ? "weight" : "input") + " of layer " + std::to_string(k / 4) + " site " + std::to_string(k % 4);
          }
        }
      }
      if (std::all_of(want.begin(), want.end(), [](float x) { return x == 0.0f; })) throw std::runtime_error("no FP8 scale recorded (a vacuous check)");
    }
    if (whole.model->fp8_delayed()) {
      const mt::Fp8ScalingState want = whole.model->fp8_scaling_state();
      const mt::Fp8ScalingState first = ranks[0].model->fp8_scaling_state();
      const auto slots = static_cast<size_t>(want.slots());
      for (size_t i = 0; i < n; ++i) {
        const mt::Fp8ScalingState got = ranks[i].model->fp8_scaling_state();
        if (got.history.size() != want.history.size() || got.scale.size() != want.scale.size()) {
          throw std::runtime_error("a rank's FP8 scaling state has another shape than the whole model's");
        }
        for (size_t j = 0; j < got.history.size(); ++j) {
          fp8_ranks_gap = std::max(fp8_ranks_gap, static_cast<double>(std::fabs(got.history[j] - first.history[j])));
          const bool gradient = (j / slots) % 3 == static_cast<size_t>(mt::kFp8GradOutput);  // ([len][3 kinds][slots])
          if (!gradient && want.history[j] != 0.0f) {
            fp8_gap = std::max(fp8_gap, static_cast<double>(std::fabs(got.history[j] - want.history[j]) / std::fabs(want.history[j])));
          }
        }
        for (size_t j = 0; j < got.scale.size(); ++j) fp8_ranks_gap = std::max(fp8_ranks_gap, static_cast<double>(std::fabs(got.scale[j] - first.scale[j])));
      }
      if (std::all_of(want.history.begin(), want.history.end(), [](float x) { return x == 0.0f; })) {
        throw std::runtime_error("no FP8 amax recorded (the check would be vacuous)");
      }
    }
    const double loss_gap = std::fabs(loss_sum - loss_whole) / std::fabs(loss_whole);
    char buf[1600];
    std::snprintf(buf, sizeof(buf), "%s: loss %.6f (whole %.6f, %.2e apart); worst parameter gradient %s %.2e from the whole sequence's; TP ranks' "
                  "copies %.2e apart%s", name, loss_sum, loss_whole, loss_gap, worst_name.c_str(), worst, tp_copies_gap,
                  moe_layers > 0 ? ("; MoE aux / z losses " + std::to_string(moe_gap) + " apart").c_str()
                  : fp8 ? ("; FP8 scales and amaxes " + std::to_string(fp8_gap) + " from the whole model's" + (fp8_worst.empty() ? "" : " (" + fp8_worst + ")") +
                           ", " + std::to_string(fp8_ranks_gap) + " between ranks" + fp8_detail).c_str()
                        : "");
    // (FP8: a value computed in another order can round to the neighbouring FP8 value, one step of 6-25% of it, and in
    // these small models (hidden 128) through the layers those steps compound: measured on an H200, each gradient of
    // the TP 2 layouts differs from the whole model's by at most the larger of 8e-2 and 1.54 times what FP8's own
    // quantisation moves the whole model's from bf16's (GPT's norm weights the most), and under delayed scaling the losses too (5e-5 and 9e-5,
    // FP8 against bf16 4e-5 and 9e-5). So an FP8 layout's parameter passes within twice that, and at least 8e-2; a
    // missing reduction or a misplaced shard moves a gradient by about its whole size. The scales are checked exactly
    // between the ranks above.)
    const double loss_tol = fp8 ? 5e-3 : 2e-3;
    const bool grads_ok = fp8 ? fp8_grad_excess < 1.0 : worst < 3e-2;
    check(loss_gap < loss_tol && grads_ok && std::isfinite(worst) && tp_copies_gap < 1e-5 && moe_gap < 2e-2 && fp8_gap < 5e-2 &&
              fp8_ranks_gap == 0,
          buf);
    for (RankRun& run : ranks) release(run);
    release(whole);
  } catch (const std::exception& e) {
    check(false, std::string(name) + ": " + e.what());
  }
}

}  // namespace

int main() {
  if (mt::visible_gpus().empty()) {
    std::printf("SKIP: no GPU visible (%s)\n", mt::gpu_unavailable_reason().c_str());
    return 77;
  }
  const char* only = std::getenv("MT_GPU_TEST_ONLY");
  only_fp8 = only != nullptr && std::string(only) == "fp8";
  only_mla = only != nullptr && std::string(only) == "mla";
  test_context_parallel("llama", 2);
  test_context_parallel("llama", 4);
  test_context_parallel("gpt", 2);  // learned positions (the chunks' own), GELU, biases
  test_context_parallel("llama-recompute", 2);  // the ring again in the recompute
  test_context_parallel("llama", 2, "a2a");      // all-to-all between the sequence and the heads (GQA: 4 heads, 2 groups)
  test_context_parallel("gpt", 4, "a2a");
  test_context_parallel("llama-recompute", 2, "a2a");
  // Hidden dropout: the CP ranks draw the whole sequence's masks at their tokens' places (the gradients and losses as
  // the whole model's only if they do).
  test_context_parallel("gpt", 2, "p2p", "--hidden-dropout 0.1 ");
  test_context_parallel("llama-recompute", 4, "p2p", "--hidden-dropout 0.1 ");
  // Documents inside sequences: the ring's blocks each with their document bias (a query whose document starts after
  // every key of a block), and a2a with the gathered document starts and the whole sequences' masks.
  test_context_parallel("llama", 2, "p2p", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("llama-recompute", 4, "p2p", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("gpt", 4, "p2p", "--reset-attention-mask --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("llama", 2, "a2a", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  test_context_parallel("gpt", 4, "a2a", "--reset-attention-mask --reset-position-ids --micro-batch-size 4 --global-batch-size 4 ");
  // With tensor parallelism (the harness's TP collectives first, on their own): each CP group's ranks hold one TP
  // rank's heads, the ring and the all-to-all run on them, and the TP reductions (and SP's gathers) meet as usual.
  test_context_parallel("llama", 1, "p2p", "", 2);
  test_context_parallel("llama", 1, "p2p", "--sequence-parallel --micro-batch-size 4 --global-batch-size 4 ", 2);  // the split layers under SP
  test_context_parallel("llama", 2, "p2p", "", 2);
  test_context_parallel("llama", 2, "p2p", "--sequence-parallel ", 2);
  test_context_parallel("gpt", 2, "a2a", "", 2);
  // FP8 under TP (no CP: FP8 with CP is refused on the CUDA engine): tensorwise, each TP shard's amax reduced over TP
  // before its cast, and delayed scaling, the amax accumulators reduced at each update; without and with SP, recomputed.
  const std::string fp8 = "--fp8-format hybrid --fp8-recipe ";
  test_context_parallel("llama", 1, "p2p", fp8 + "tensorwise ", 2);
  test_context_parallel("llama", 1, "p2p", fp8 + "tensorwise --sequence-parallel ", 2);
  test_context_parallel("llama", 1, "p2p", fp8 + "delayed --fp8-amax-history-len 4 ", 2);
  test_context_parallel("llama-recompute", 1, "p2p", fp8 + "delayed --fp8-amax-history-len 4 --sequence-parallel ", 2);
  test_context_parallel("gpt", 1, "p2p", fp8 + "tensorwise ", 2);  // (GPT's biases and GELU apart from the GEMM)
  test_context_parallel("gpt", 1, "p2p", fp8 + "tensorwise --sequence-parallel ", 2);
  test_context_parallel("gpt", 1, "p2p", fp8 + "delayed --fp8-amax-history-len 4 --sequence-parallel ", 2);
  test_context_parallel("gpt", 1, "p2p", "--fp8-format e4m3 --fp8-recipe tensorwise ", 2);
  // MoE layers: each CP rank routes its own tokens; the aux and z losses' statistics summed over the CP group (the
  // whole sequences' counts, scores and lse^2), each rank's router gradient its tokens' part.
  // The ring's attention rounds differently from the whole sequence's (a2a's is the same), which can flip a near-tie of
  // the top-k and move a token to another expert (measured: an expert's gradient 0.4 apart at CP 2 with top-2 of 4); so
  // the ring's first case chooses every expert (top-4 of 4: the routing weights and aux statistics continuous).
  const std::string experts = "--num-experts 4 --moe-aux-loss-coeff 1e-1 --moe-z-loss-coeff 1e-2 ", moe = experts + "--moe-router-topk 2 ";
  test_context_parallel("llama", 2, "p2p", experts + "--moe-router-topk 4 ");
  test_context_parallel("llama-recompute", 4, "p2p", moe + "--moe-router-load-balancing-type seq_aux_loss --moe-shared-expert-intermediate-size 64 ");
  test_context_parallel("llama", 2, "a2a", moe + "--moe-router-score-function sigmoid --moe-router-enable-expert-bias ");
  test_context_parallel("llama", 2, "a2a", moe + "--moe-router-load-balancing-type global_aux_loss ");
  // MoE under TP + SP (the experts split over expert-TP = TP, Megatron's default): every TP rank routes the gathered rows
  // alike, its experts' shards give partial outputs and routing-weight gradients, the layer's TP reductions complete them
  // (the aux and z terms at 1 / TP each, the router weight's gradient summed over TP); with a shared expert, recomputed,
  // and CP 2 x TP 2. (The TP layers' attention rounds differently from one model's too, so the routing can flip near-ties
  // as the ring's can: a capacity factor's drops, which a flip near the capacity moves, are checked against the CPU engine
  // on 2 GPUs by run_parallel_parity.sh instead; measured here: an expert's gradient 0.38 apart at factor 0.75, and 0.22
  // with top-2 at micro batch 4, hence top-4 of 4 there.)
  test_context_parallel("llama", 1, "p2p", experts + "--moe-router-topk 4 --sequence-parallel --micro-batch-size 4 --global-batch-size 4 ", 2);
  test_context_parallel("llama-recompute", 1, "p2p", moe + "--sequence-parallel --moe-shared-expert-intermediate-size 64 "
                        "--moe-router-load-balancing-type seq_aux_loss ", 2);
  test_context_parallel("llama", 2, "p2p", experts + "--moe-router-topk 4 --sequence-parallel ", 2);
  // Multi-latent attention under TP (written in the forty-third session, run in the forty-fourth): the up projections split the heads, the down projections and latent norms whole on every rank
  // with their gradients summed over TP (without SP by the layer's own sum, under SP by the replicated-parameter sum);
  // recomputed up projections; MoE layers beside.
  test_context_parallel("deepseek", 1, "p2p", "", 2);
  test_context_parallel("deepseek", 1, "p2p", "--sequence-parallel ", 2);
  test_context_parallel("deepseek-gpt", 1, "p2p", "", 2);
  test_context_parallel("deepseek", 1, "p2p", "--sequence-parallel --recompute-granularity selective --recompute-modules mla_up_proj ", 2);
  test_context_parallel("deepseek", 1, "p2p", experts + "--moe-router-topk 4 --sequence-parallel ", 2);
  std::printf("%d failure(s)\n", failures);
  return failures == 0 ? 0 : 1;
}
