// test_parity.cpp: multi-rank training equals one rank. Run under mpirun: every rank trains the
// layout under test over MPI and, alone, the same model on one rank; losses per iteration must agree
// to 1e-5 (relative) and every parameter element of each shard must equal the element at the same
// global index of the single-rank model.
// Usage: mpirun -np N test_parity <gpt|llama|llama-mqa|deepseek> <layout flags...>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/tcp_communicator.h"
#include "config/cli.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "model/gpt_model.h"
#include "parallel/rank_layout.h"
#include "train/trainer.h"

using namespace mt;

namespace {

// common: flags for both runs (a schedule, e.g. a batch-size ramp-up over --train-samples); layout: the
// multi-rank run's only.
Config make_config(const std::string& model, const std::string& common, const std::string& layout_flags) {
  const std::string schedule = common.find("--train-samples") != std::string::npos ? "" : "--train-iters 8 --lr-warmup-iters 2 ";
  // (a step batch-size schedule sets each iteration's batch: no --global-batch-size beside it)
  const std::string batch = common.find("--step-batch-size-schedule") != std::string::npos ? "" : "--global-batch-size 8 ";
  std::string base =
      "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 "
      "--micro-batch-size 2 " + batch + "--lr 2e-3 --mock-data "
      "--vocab-size 120 --make-vocab-size-divisible-by 32 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 "
      "--log-interval 1000 --clip-grad 0.5 --seed 7 "
      // Adam turns rounding-level gradients (the key bias's is exactly zero in exact arithmetic) into
      // full-size steps; an epsilon above that level keeps the comparison about the maths.
      "--adam-eps 1e-4 ";
  if (model == "llama" || model == "llama-mqa") {
    // llama-mqa: one K/V head for all four query heads (multi-query attention).
    base += "--normalization RMSNorm --swiglu --ffn-hidden-size 48 --position-embedding-type rope --group-query-attention "
            "--num-query-groups " + std::string(model == "llama" ? "2" : "1") + " --untie-embeddings-and-output-weights --disable-bias-linear ";
  } else if (model == "deepseek") {
    // Multi-latent attention (DeepSeek's): the queries through a latent with its norm, YaRN (its factor in the softmax
    // scale too), value heads wider than the query / key heads' 6 + 4.
    base += "--normalization RMSNorm --swiglu --ffn-hidden-size 48 --position-embedding-type rope --multi-latent-attention --q-lora-rank 12 "
            "--kv-lora-rank 10 --qk-head-dim 6 --qk-pos-emb-head-dim 4 --v-head-dim 12 --qk-layernorm --rotary-scaling-factor 4 --mscale 1 "
            "--mscale-all-dim 1 --untie-embeddings-and-output-weights --disable-bias-linear ";
  }
  CLI::App app;
  ConfigCli cli(app);
  app.parse(base + schedule + common + " " + layout_flags, false);
  return cli.build();
}

}  // namespace

int main(int argc, char** argv) {
  // Under mpirun the layout's groups are MPI communicators; launched torchrun-style (RANK, WORLD_SIZE,
  // MASTER_ADDR, MASTER_PORT: tests/mpi/torchrun_style.sh) they are TCP ones.
  const LaunchInfo launch = detect_launch();
  const bool tcp = launch.kind == LauncherKind::kTorchrun;
  int rank = static_cast<int>(launch.rank), world = static_cast<int>(launch.world_size);
  if (!tcp) {
    mpi_initialize(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
  }
  if (argc < 2) {
    if (rank == 0) std::fprintf(stderr, "usage: test_parity <gpt|llama|llama-mqa|deepseek> [layout flags]\n");
    mpi_finalize();
    return 2;
  }
  const std::string model = argv[1];
  // [--common FLAGS... --layout] LAYOUT FLAGS... [--param-tolerance X] [--loss-tolerance X]
  // --loss-tolerance: for layouts that compute another function by design (FP8 under expert parallelism, where an
  // expert's rows from several ranks' microbatches share its scales): the losses and aux losses within X, and the
  // routing (a near-tie may fall the other way) and the drops not compared.
  std::string flags, common;
  bool in_common = false;
  double param_tolerance = 1e-4, loss_tolerance = 1e-5;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--param-tolerance" && i + 1 < argc) param_tolerance = std::stod(argv[++i]);
    else if (a == "--loss-tolerance" && i + 1 < argc) loss_tolerance = std::stod(argv[++i]);
    else if (a == "--common") in_common = true;
    else if (a == "--layout") in_common = false;
    else (in_common ? common : flags) += a + " ";
  }
  int failures = 0;
  {
    Config cfg = make_config(model, common, flags);
    const Diagnostics d = validate(cfg, world, Purpose::kTrain);
    if (!d.ok()) {
      if (rank == 0) std::fprintf(stderr, "invalid test layout: %s\n", d.errors.front().c_str());
      if (tcp) return 2;
      mpi_abort_job(2);
    }
    Config single = make_config(model, common, "");
    resolve(cfg, world);
    resolve(single, 1);
    const RankLayout layout = RankLayout::from_config(cfg, world);
    ProcessGroups groups = tcp ? make_tcp_process_groups(make_tcp_world(launch, rendezvous_port(launch), 60), layout, rank)
                               : make_mpi_process_groups(layout, rank);
    const TrainResult par = train(cfg, groups, {true, rank});
    const TrainResult ref = train(single, ProcessGroups::single(), {true, 0});
    double worst_loss = 0;
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      const double rel = std::fabs(par.losses[i] - ref.losses[i]) / std::fabs(ref.losses[i]);
      worst_loss = std::max(worst_loss, rel);
    }
    // MoE: the auxiliary losses as closely, and the same share of dropped choices.
    const bool exact = loss_tolerance <= 1e-5;
    if (par.moe_losses.size() != ref.moe_losses.size() || par.moe_losses.names != ref.moe_losses.names || (exact && (par.dropped_fraction != ref.dropped_fraction ||
                                                                     par.routing_digest != ref.routing_digest))) {
      worst_loss = 1;
    } else {
      for (size_t i = 0; i < ref.moe_losses.size(); ++i) {
        for (size_t j = 0; j < ref.moe_losses.names.size(); ++j) {
          const double a = par.moe_losses.at(i, j), b = ref.moe_losses.at(i, j);
          worst_loss = std::max(worst_loss, std::fabs(a - b) / std::max(1e-12, std::fabs(b)));
        }
      }
    }
    // --moe-per-layer-logging: the last iteration's losses per layer (each stage's layers summed over the pipeline).
    if (par.moe_layer_losses.size() != ref.moe_layer_losses.size()) {
      worst_loss = 1;
    } else {
      for (size_t j = 0; j < ref.moe_layer_losses.size(); ++j) {
        const std::vector<double>&a = par.moe_layer_losses[j].second, &b = ref.moe_layer_losses[j].second;
        if (a.size() != b.size()) worst_loss = 1;
        for (size_t l = 0; l < a.size() && l < b.size(); ++l) {
          worst_loss = std::max(worst_loss, std::fabs(a[l] - b[l]) / std::max(1e-12, std::fabs(b[l])));
        }
      }
    }
    if (worst_loss > loss_tolerance) ++failures;
    // --log-num-zeros-in-grad: every iteration's count of zero gradient entries as one rank's (each parameter counted once
    // over the layout's ranks), and with untied embeddings some zeros there (the input embedding's rows of the tokens no
    // sample holds, hidden-size entries each; GPT's tied output layer gives every row a gradient). Within 2: a gradient
    // that is zero in exact arithmetic but summed in another order (GPT's key bias: softmax ignores a score added to a
    // whole row) may land on 0.0f in one layout and not the other.
    std::string zeros_note;
    if (cfg.logging.log_num_zeros_in_grad) {
      const bool some = !ref.num_zeros.empty() && (ref.num_zeros.back() > 0 || !cfg.model.untie_embeddings_and_output_weights);
      bool same = par.num_zeros.size() == ref.num_zeros.size() && some;
      for (size_t i = 0; same && i < ref.num_zeros.size(); ++i) same = std::fabs(par.num_zeros[i] - ref.num_zeros[i]) <= 2.0;
      zeros_note = ", num zeros " + std::to_string(static_cast<long long>(par.num_zeros.empty() ? -1 : par.num_zeros.back())) + " / " +
                   std::to_string(static_cast<long long>(ref.num_zeros.empty() ? -1 : ref.num_zeros.back()));
      if (!same) {
        ++failures;
        for (size_t i = 0; i < std::max(par.num_zeros.size(), ref.num_zeros.size()); ++i) {
          zeros_note += " [" + std::to_string(i) + ": " + (i < par.num_zeros.size() ? std::to_string(par.num_zeros[i]) : "-") + " / " +
                        (i < ref.num_zeros.size() ? std::to_string(ref.num_zeros[i]) : "-") + "]";
        }
      }
    }
    const ParamStore& ps = par.model->params();
    const ParamStore& rs = ref.model->params();
    double worst_param = 0;
    std::string worst_name;
    for (size_t i = 0; i < ps.size(); ++i) {
      const size_t ri = rs.index_of(ps.info(i).name);
      for (int64_t e = 0; e < ps.info(i).numel; ++e) {
        const double a = ps.param(i)[e], b = rs.param(ri)[ps.global_index(i, e)];
        const double err = std::fabs(a - b) / (1e-3 + std::fabs(b));
        if (err > worst_param) {
          worst_param = err;
          worst_name = ps.info(i).name;
        }
      }
    }
    if (worst_param > param_tolerance) ++failures;
    for (int r = 0; r < world; ++r) {
      if (r == rank) {
        std::printf("rank %d %s [%s%s]: losses %.6f..%.6f, worst loss rel diff %.2e, worst param rel diff %.2e (%s)%s %s\n", rank,
                    model.c_str(), common.c_str(), flags.c_str(), ref.losses.front(), ref.losses.back(), worst_loss, worst_param,
                    worst_name.c_str(), zeros_note.c_str(), failures ? "FAIL" : "ok");
        std::fflush(stdout);
      }
      groups.world->barrier();
    }
    float any = static_cast<float>(failures);
    groups.world->all_reduce(&any, 1, ReduceOp::kMax);
    failures = any > 0 ? 1 : 0;
  }
  mpi_finalize();
  return failures ? 1 : 0;
}
