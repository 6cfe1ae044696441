// test_stages.cpp: the shared parameter layout cut into pipeline stages, the CPU stage (a model split into
// stages chained on one process gives the whole model's loss and gradients; several microbatches in flight;
// the weight gradients run apart), and the schedule layer (lists, checks, the executor's flags).
#include <cmath>
#include <map>
#include <string>

#include "catch.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "model/gpt_model.h"
#include "model/layout.h"
#include "pipeline/cpu_stage.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "fake_groups.h"
#include "tiny_models.h"

using namespace mt;

namespace {

// Dropout keyed by the global layer: stages must draw the whole model's masks. LLaMA with --qk-layernorm.
Config tiny(bool llama, int64_t layers = 4) { return test::tiny_decoder(llama, layers, 0.1, llama); }

Microbatch batch(int seed) {
  Microbatch mb;
  mb.B = 2;
  mb.S = 6;
  for (int i = 0; i < 12; ++i) {
    mb.tokens.push_back((i * 7 + seed * 3) % 11);
    mb.labels.push_back((i * 5 + seed + 1) % 11);
    mb.positions.push_back(i % 6);
    mb.loss_mask.push_back(i == 4 + seed % 3 ? 0.0f : 1.0f);
  }
  mb.first_sample = 2 * seed;
  return mb;
}

// The pipeline group seen from one stage (one process plays every stage: nothing may be communicated over it).
using PositionOnly = test::NoCollectives;

ProcessGroups stage_groups(int pp_rank, int pp_size) {
  ProcessGroups g = ProcessGroups::single();
  g.pp = std::make_shared<PositionOnly>(pp_rank, pp_size);
  return g;
}

std::map<std::string, std::vector<float>> grads_by_name(GPTModel& m) {
  std::map<std::string, std::vector<float>> out;
  ParamStore& ps = m.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps.info(i);
    std::vector<float> g(ps.grad(i), ps.grad(i) + p.numel);
    auto& slot = out[p.name];
    if (slot.empty()) slot.assign(g.size(), 0.0f);
    for (size_t e = 0; e < g.size(); ++e) slot[e] += g[e];  // a tied copy adds to the embedding's
  }
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  }
  return diff / scale;
}

}  // namespace

TEST_CASE("layout: stages partition the whole model's parameters, names and values", "[stages]") {
  for (bool llama : {false, true}) {
    const Config c = tiny(llama);
    ParamStore whole;
    const ModelLayout w = build_model_layout(c, {}, whole);
    REQUIRE(w.pre_process);
    REQUIRE(w.post_process);
    REQUIRE(w.layers.size() == 4);
    REQUIRE(w.layers_range.first == 0);
    for (int64_t pp : {2, 4}) {
      std::map<std::string, int> seen;
      for (int64_t r = 0; r < pp; ++r) {
        ParamStore part;
        const ModelLayout m = build_model_layout(c, {0, 1, r, pp}, part);
        CHECK(m.pre_process == (r == 0));
        CHECK(m.post_process == (r == pp - 1));
        CHECK(m.layers_range.first == r * 4 / pp);
        CHECK(m.layers_range.count() == 4 / pp);
        CHECK((m.word_embeddings != kNoParam) == (r == 0));
        CHECK((m.output_w != kNoParam) == (r == pp - 1));
        for (size_t i = 0; i < part.size(); ++i) {
          const ParamInfo& p = part.info(i);
          CHECK(p.grad_group == GradGroup::kDense);
          if (p.tied_copy) {
            // The last stage's copy of the tied embedding: the output layer, the embedding's values.
            CHECK((r == pp - 1 && !llama && i == m.output_w));
            continue;
          }
          ++seen[p.name];
          const size_t j = whole.index_of(p.name);
          REQUIRE(whole.info(j).numel == p.numel);
          CHECK(whole.info(j).global_shape == p.global_shape);
          for (int64_t e = 0; e < p.numel; ++e) REQUIRE(part.param(i)[e] == whole.param(j)[e]);
        }
        // Each layer's parameters are contiguous and named by the global layer index.
        for (const LayerParams& ly : m.layers) {
          CHECK(part.info(ly.first).name == "layers." + std::to_string(ly.layer) + ".input_norm.weight");
          CHECK(part.info(ly.end - 1).name == "layers." + std::to_string(ly.layer) + (llama ? ".mlp.fc2.weight" : ".mlp.fc2.bias"));
        }
      }
      CHECK(seen.size() == whole.size());
      for (const auto& [name, n] : seen) CHECK(n == 1);
    }
  }
  Config c = tiny(false, 3);
  ParamStore s;
  CHECK_THROWS_AS(build_model_layout(c, {0, 1, 0, 2}, s), ConfigError);
}

TEST_CASE("layout: TP-replicated parameters are the norms and the row-parallel biases", "[stages]") {
  const Config c = tiny(false);
  ParamStore ps;
  build_model_layout(c, {0, 2, 0, 1}, ps);
  for (const ParamInfo& p : ps.infos()) {
    const bool replicated = p.name.find("norm") != std::string::npos || p.name.find("proj.bias") != std::string::npos ||
                            p.name.find("fc2.bias") != std::string::npos || p.name.find("position") != std::string::npos;
    CHECK(p.tp_replicated() == replicated);
  }
}

TEST_CASE("CPU stages chained on one process give the whole model's loss and gradients", "[stages]") {
  for (bool llama : {false, true}) {
    const Config c = tiny(llama);
    GPTModel whole(c, ProcessGroups::single());
    whole.params().zero_grads();
    const Microbatch mb = batch(1);
    const float loss = whole.forward(mb, 3, true);
    whole.backward(0.5f);
    const auto expect = grads_by_name(whole);
    for (int pp : {2, 4}) {
      std::vector<std::unique_ptr<GPTModel>> stages;
      for (int r = 0; r < pp; ++r) {
        stages.push_back(std::make_unique<GPTModel>(c, stage_groups(r, pp)));
        stages.back()->params().zero_grads();
      }
      GPTModel::Activations x;
      float staged_loss = 0;
      for (int r = 0; r < pp; ++r) {
        GPTModel::Activations out;
        staged_loss = stages[static_cast<size_t>(r)]->forward_stage(7, mb, 3, true, std::move(x), &out);
        x = std::move(out);
      }
      CHECK(staged_loss == loss);  // the same operations in the same order
      GPTModel::Activations dx;
      for (int r = pp - 1; r >= 0; --r) {
        GPTModel::Activations din;
        stages[static_cast<size_t>(r)]->backward_stage(7, 0.5f, true, std::move(dx), &din);
        CHECK(stages[static_cast<size_t>(r)]->in_flight() == 0);
        dx = std::move(din);
      }
      std::map<std::string, std::vector<float>> got;
      for (auto& s : stages) {
        for (auto& [name, g] : grads_by_name(*s)) {
          auto& slot = got[name];
          if (slot.empty()) slot.assign(g.size(), 0.0f);
          for (size_t e = 0; e < g.size(); ++e) slot[e] += g[e];
        }
      }
      REQUIRE(got.size() == expect.size());
      for (const auto& [name, g] : expect) {
        INFO(name << " at PP " << pp);
        // Bit for bit but the tied embedding, whose two halves are added in another order.
        if (name == "embedding.word_embeddings.weight" && !llama) CHECK(max_rel_diff(g, got[name]) < 1e-6);
        else CHECK(g == got[name]);
      }
    }
  }
}

TEST_CASE("CPU stage: microbatches in flight and weight gradients apart give the same gradients", "[stages]") {
  const Config c = tiny(true);
  GPTModel ref(c, ProcessGroups::single());
  ref.params().zero_grads();
  for (int m = 0; m < 3; ++m) {
    ref.forward(batch(m), 2, true);
    ref.backward(1.0f / 3, m == 2);
  }
  const auto expect = grads_by_name(ref);
  SECTION("B and W apart, in order") {
    GPTModel m(c, ProcessGroups::single());
    m.params().zero_grads();
    CpuPipelineStage stage(m, [](int64_t i) { return batch(static_cast<int>(i)); }, 2, 1.0f / 3);
    run_schedule(no_pipelining_schedule(3, true), stage);
    CHECK(m.in_flight() == 0);
    for (const auto& [name, g] : grads_by_name(m)) CHECK(g == expect.at(name));
  }
  SECTION("three forwards in flight, backwards in reverse, every W at the end") {
    GPTModel m(c, ProcessGroups::single());
    m.params().zero_grads();
    for (int i = 0; i < 3; ++i) m.forward_stage(i, batch(i), 2, true, {}, nullptr);
    CHECK(m.in_flight() == 3);
    for (int i = 2; i >= 0; --i) m.backward_stage(i, 1.0f / 3, i == 0, {}, nullptr, true);
    CHECK(m.in_flight() == 3);  // their weight gradients are due
    for (int i = 0; i < 3; ++i) m.backward_weights(i, i == 2);
    CHECK(m.in_flight() == 0);
    for (const auto& [name, g] : grads_by_name(m)) {
      INFO(name);
      CHECK(max_rel_diff(expect.at(name), g) < 1e-5);  // the microbatches' sums in another order
    }
  }
  SECTION("a backward without its forward is refused") {
    GPTModel m(c, ProcessGroups::single());
    CHECK_THROWS_AS(m.backward_stage(5, 1.0f, true, {}, nullptr), std::logic_error);
    CHECK_THROWS_AS(m.backward_weights(5, true), std::logic_error);
    // A forward over a microbatch whose weight gradients are still due would lose them.
    m.forward_stage(1, batch(1), 2, true, {}, nullptr);
    m.backward_stage(1, 1.0f, true, {}, nullptr, true);
    CHECK_THROWS_AS(m.forward_stage(1, batch(1), 2, true, {}, nullptr), std::logic_error);
  }
}

TEST_CASE("schedules: lists, checks and the executor's flags", "[stages]") {
  for (int64_t n : {1, 2, 7, 32}) {
    for (bool split : {false, true}) {
      const Schedule s = no_pipelining_schedule(n, split);
      CHECK(s.size() == static_cast<size_t>(n * (split ? 3 : 2)));
      CHECK(check_schedule(s, n, 1).empty());
      CHECK(peak_in_flight(s) == 1);
    }
  }
  Schedule bad = no_pipelining_schedule(3);
  std::swap(bad[0], bad[1]);  // B0 before F0
  CHECK(check_schedule(bad, 3, 1).find("before its forward") != std::string::npos);
  Schedule missing = no_pipelining_schedule(3);
  missing.pop_back();
  CHECK(!check_schedule(missing, 3, 1).empty());
  Schedule twice = no_pipelining_schedule(2);
  twice.push_back({ActionKind::kForward, 1, 0});
  CHECK(!check_schedule(twice, 2, 1).empty());
  Schedule w_first = {{ActionKind::kForward, 0, 0}, {ActionKind::kBackwardWeight, 0, 0}, {ActionKind::kBackwardInput, 0, 0}};
  CHECK(!check_schedule(w_first, 1, 1).empty());

  struct Recorder final : PipelineStage {
    std::vector<std::string> log;
    void forward(int64_t m, int64_t) override { log.push_back("F" + std::to_string(m)); }
    void backward(int64_t m, int64_t, bool last, bool w) override {
      log.push_back(std::string(w ? "B" : "Bi") + std::to_string(m) + (last ? "!" : ""));
    }
    void backward_weights(int64_t m, int64_t, bool last) override { log.push_back("W" + std::to_string(m) + (last ? "!" : "")); }
  } rec;
  run_schedule(no_pipelining_schedule(3, true), rec, [&] { rec.log.push_back("arm"); });
  CHECK(rec.log == std::vector<std::string>{"F0", "Bi0", "W0", "F1", "Bi1", "W1", "F2", "arm", "Bi2!", "W2!"});
  Recorder late;  // every W after every B: the reductions go with the last W, not with W of the last B
  run_schedule({{ActionKind::kForward, 0, 0}, {ActionKind::kForward, 1, 0}, {ActionKind::kBackwardInput, 1, 0}, {ActionKind::kBackwardInput, 0, 0},
                {ActionKind::kBackwardWeight, 0, 0}, {ActionKind::kBackwardWeight, 1, 0}},
               late);
  CHECK(late.log == std::vector<std::string>{"F0", "F1", "Bi1", "Bi0!", "W0", "W1!"});
  Recorder plain;
  CHECK_THROWS_AS(run_schedule({{ActionKind::kSendForward, 0, 0}}, plain), std::logic_error);
}

TEST_CASE("1F1B: every stage's list is whole, the stages' transfers meet without deadlock, in flight as Megatron", "[stages]") {
  for (int64_t P = 1; P <= 8; ++P) {
    for (int64_t M = 1; M <= 32; ++M) {
      for (bool split : {false, true}) {
        std::vector<Schedule> all;
        for (int64_t r = 0; r < P; ++r) {
          all.push_back(one_f_one_b_schedule(r, P, M, split));
          INFO("P " << P << " M " << M << " stage " << r);
          REQUIRE(check_schedule(all.back(), M, 1).empty());
          // Megatron's warm-up keeps min(P - r, M) microbatches' activations on stage r.
          CHECK(peak_in_flight(all.back()) == std::min(P - r, M));
        }
        INFO("P " << P << " M " << M);
        CHECK(check_pipeline(all).empty());
        std::vector<Schedule> fwd;
        for (int64_t r = 0; r < P; ++r) fwd.push_back(forward_only_schedule(r, P, M));
        CHECK(check_pipeline(fwd).empty());
      }
    }
  }
  // The checks catch what breaks a pipeline: a receive nothing sends, and a stage that sends before it
  // receives where the neighbour does the same (unbatched: each waits for the other).
  std::vector<Schedule> all{one_f_one_b_schedule(0, 2, 4), one_f_one_b_schedule(1, 2, 4)};
  all[1].insert(all[1].begin(), ScheduleAction{ActionKind::kRecvForward, 9, 0});
  CHECK(!check_pipeline(all).empty());
  std::vector<Schedule> crossed{{{ActionKind::kForward, 0, 0}, {ActionKind::kSendForward, 0, 0}, {ActionKind::kForward, 1, 0}, {ActionKind::kRecvBackward, 1, 0}},
                                {{ActionKind::kSendBackward, 1, 0}, {ActionKind::kForward, 5, 0}, {ActionKind::kRecvForward, 0, 0}}};
  CHECK(check_pipeline(crossed).find("waits forever") != std::string::npos);
  std::vector<Schedule> swapped{{{ActionKind::kForward, 0, 0}, {ActionKind::kSendForward, 0, 0}},
                                {{ActionKind::kRecvForward, 1, 0}, {ActionKind::kForward, 1, 0}}};
  CHECK(check_pipeline(swapped).find("exchange microbatch") != std::string::npos);
}

TEST_CASE("ZB-H1 and interleaved 1F1B: whole lists, transfers that meet without deadlock, the in-flight peaks", "[stages]") {
  for (int64_t P = 1; P <= 8; ++P) {
    for (int64_t M = 1; M <= 32; ++M) {
      std::vector<Schedule> zb;
      for (int64_t r = 0; r < P; ++r) {
        zb.push_back(zero_bubble_h1_schedule(r, P, M));
        INFO("zb-h1 P " << P << " M " << M << " stage " << r);
        REQUIRE(check_schedule(zb.back(), M, 1).empty());
        // W deferred by up to P - 1 - r microbatches more than 1F1B: never more in flight than 1F1B's first stage.
        CHECK(peak_in_flight(zb.back()) == std::min(P, M));
        int64_t splits = 0;
        for (const ScheduleAction& a : zb.back()) splits += a.kind == ActionKind::kBackwardWeight;
        CHECK(splits == M);
      }
      INFO("zb-h1 P " << P << " M " << M);
      CHECK(check_pipeline(zb).empty());
      if (P < 2) continue;
      // Groups of G microbatches through each virtual stage (--microbatch-group-size-per-virtual-pipeline-stage; G = P is
      // Megatron's default): G in [P, M] and a last group of none or at least P, else refused.
      for (int64_t G = P; G <= std::min<int64_t>(M, P + 5); ++G) {
        const bool fits = M % G == 0 || M % G >= P;
        for (int64_t V = 2; V <= 4; ++V) {
          if (!fits) {
            CHECK_THROWS_AS(interleaved_schedule(0, P, V, M, G), std::logic_error);
            CHECK_THROWS_AS(forward_only_schedule(0, P, M, V, G), std::logic_error);
            continue;
          }
          std::vector<Schedule> il, fwd;
          for (int64_t r = 0; r < P; ++r) {
            il.push_back(interleaved_schedule(r, P, V, M, G));
            fwd.push_back(forward_only_schedule(r, P, M, V, G));
            INFO("interleaved P " << P << " V " << V << " M " << M << " G " << G << " stage " << r);
            REQUIRE(check_schedule(il.back(), M, V).empty());
            REQUIRE(check_schedule(fwd.back(), M, V).find("does not finish") != std::string::npos);  // forwards only
            // Megatron's warm-up, plus the steady state's one forward, each a chunk's activations.
            const int64_t warmup = std::min(M * V, (P - r - 1) * 2 + (V - 1) * G);
            CHECK(peak_in_flight(il.back()) == std::min(M * V, warmup + 1));
          }
          INFO("interleaved P " << P << " V " << V << " M " << M << " G " << G);
          CHECK(check_pipeline(il, V) == "");
          CHECK(check_pipeline(fwd, V) == "");
        }
      }
      if (M < P) {  // (the group, at least P, cannot fit: refused)
        CHECK_THROWS_AS(interleaved_schedule(0, P, 2, M), std::logic_error);
      }
    }
  }
  // Megatron's interleaved order on 2 stages, 2 chunks, 4 microbatches: stage 1 starts its steady state after
  // (V - 1) x P = 2 forwards; groups of P microbatches go through chunk 0, then chunk 1.
  std::vector<std::string> names;
  for (const ScheduleAction& a : interleaved_schedule(1, 2, 2, 4)) {
    if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) names.push_back(action_name(a));
  }
  CHECK(names == std::vector<std::string>{"F0", "F1", "F0.1", "B0.1", "F1.1", "B1.1", "F2", "B0", "F3", "B1", "F2.1", "B2.1", "F3.1", "B3.1", "B2", "B3"});
  CHECK_THROWS_AS(interleaved_schedule(0, 2, 2, 3), std::logic_error);
  // Megatron's documented table for PP 2, VP 2, groups of 3, 5 microbatches: rank 0's forwards run microbatches
  // 0 1 2 0 1 2 3 4 3 4 through chunks 0 0 0 1 1 1 0 0 1 1.
  std::vector<std::string> forwards;
  for (const ScheduleAction& a : interleaved_schedule(0, 2, 2, 5, 3)) {
    if (a.kind == ActionKind::kForward) forwards.push_back(action_name(a));
  }
  CHECK(forwards == std::vector<std::string>{"F0", "F1", "F2", "F0.1", "F1.1", "F2.1", "F3", "F4", "F3.1", "F4.1"});
  // The checker follows each pair of ranks' messages in the order posted: two activations crossing on one link
  // in the opposite order to the receives are caught, even though each receive has a matching send somewhere.
  std::vector<Schedule> crossed{{{ActionKind::kForward, 0, 0}, {ActionKind::kForward, 1, 0}, {ActionKind::kSendForward, 1, 0}, {ActionKind::kSendForward, 0, 0}},
                                {{ActionKind::kRecvForward, 0, 0}, {ActionKind::kRecvForward, 1, 0}}};
  CHECK(check_pipeline(crossed).find("exchange microbatch") != std::string::npos);
  std::vector<Schedule> early{{{ActionKind::kForward, 0, 0}, {ActionKind::kSendForward, 0, 0}}, {{ActionKind::kForward, 0, 0}, {ActionKind::kRecvForward, 0, 0}}};
  CHECK(check_pipeline(early).find("before its activations arrive") != std::string::npos);
  // ZB-H1's last stage defers its W passes by P - 1 microbatches; its first stage runs each W with its B.
  std::vector<std::string> last;
  for (const ScheduleAction& a : zero_bubble_h1_schedule(2, 3, 4)) last.push_back(action_name(a));
  CHECK(last == std::vector<std::string>{"RF0", "F0", "Bi0", "SB0", "RF1", "F1", "Bi1", "SB1", "RF2", "F2", "Bi2", "SB2", "RF3", "W0", "F3", "Bi3", "SB3", "W1", "W2", "W3"});
}

TEST_CASE("pipeline timing: the simulated bubbles are the papers' (1F1B, interleaved, ZB-H1)", "[stages]") {
  // F, B and W of a microbatch cost 1 each per chunk's share of the stage (a whole backward 2): 1F1B takes
  // (M + P - 1) x 3 (Narayanan et al.), interleaving over V chunks shrinks the bubble to (P - 1) x 3 / V, and
  // ZB-H1's is (P - 1) x (F + B - W) = P - 1 (Qi et al.).
  for (int64_t P : {2, 4, 8}) {
    for (int64_t M : {8, 16, 32}) {
      for (int64_t V : {1, 2, 4}) {
        const auto cost = [V](int64_t, const ScheduleAction& a) { return (a.kind == ActionKind::kBackward ? 2.0 : 1.0) / static_cast<double>(V); };
        std::vector<Schedule> il, zb;
        for (int64_t r = 0; r < P; ++r) {
          il.push_back(interleaved_schedule(r, P, V, M));
          zb.push_back(zero_bubble_h1_schedule(r, P, M));
        }
        INFO("P " << P << " M " << M << " V " << V);
        const PipelineTiming t = simulate_pipeline(il, V, cost);
        CHECK(t.error.empty());
        CHECK(t.makespan == Approx(3.0 * static_cast<double>(M) + 3.0 * static_cast<double>(P - 1) / static_cast<double>(V)));
        CHECK(t.busy == Approx(3.0 * static_cast<double>(M * P)));
        if (V == 1) {
          CHECK(t.bubble(P) == Approx(static_cast<double>(P - 1) / static_cast<double>(M + P - 1)));
          CHECK(simulate_pipeline(zb, 1, cost).makespan == Approx(3.0 * static_cast<double>(M) + static_cast<double>(P - 1)));
        }
      }
    }
  }
}

TEST_CASE("layout: uneven pipeline stages from --decoder-first / --decoder-last-pipeline-num-layers", "[stages]") {
  Config c = tiny(false, 4);
  c.parallel.pipeline_model_parallel_size = 2;
  c.parallel.decoder_first_pipeline_num_layers = 1;
  CHECK(stage_layers(c, 0, 2).first == 0);
  CHECK(stage_layers(c, 0, 2).end == 1);
  CHECK(stage_layers(c, 1, 2).first == 1);
  CHECK(stage_layers(c, 1, 2).end == 4);
}
