// test_attention_window.cpp: sliding-window attention, Megatron's --window-size and --window-attn-skip-freq: the tuple's
// spellings, the layers that have the window (Megatron's is_layer_window_attention), the rules (a causal model's right
// bound is 0; context parallelism allowed: the CPU engine's attention blocks take the window), YAML; and a model whose window spans the sequence computes what the plain
// one does, a narrower one does not, each layer by its own setting.
#include <string>
#include <vector>

#include "catch.h"
#include "config/attention_window.h"
#include "config/errors.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/yaml_io.h"
#include "model/gpt_model.h"
#include "tiny_models.h"

using namespace mt;

namespace {

std::string diagnostics(const Config& c, int64_t world) {
  const Diagnostics d = validate(c, world, Purpose::kTrain);
  std::string all;
  for (const auto& e : d.errors) all.append("error: ").append(e).append("\n");
  for (const auto& w : d.warnings) all.append("warning: ").append(w).append("\n");
  return all;
}

Config base(int64_t layers) {
  Config c;
  c.model.num_layers = layers;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = 64;
  c.data.seq_length = 64;
  c.training.micro_batch_size = 2;
  c.training.train_iters = 2;
  c.training.lr = 1e-3;
  c.data.mock_data = true;
  return c;
}

}  // namespace

TEST_CASE("--window-size: Megatron's tuple, and the layers with the window") {
  CHECK(parse_window_size("127,0").left == 127);
  CHECK(parse_window_size("(4095, 0)").right == 0);
  CHECK(parse_window_size("'(8,-1)'").right == -1);
  CHECK_THROWS_AS(parse_window_size("127"), ConfigError);
  CHECK_THROWS_AS(parse_window_size("a,0"), ConfigError);
  CHECK_THROWS_AS(parse_window_size("1,2,3"), ConfigError);
  CHECK_THROWS_AS(parse_window_size("-2,0"), ConfigError);
  Config c = base(4);
  CHECK(attention_windows(c).empty());
  c.model.window_size = "3,0";
  CHECK(attention_windows(c) == std::vector<int64_t>{3, 3, 3, 3});
  c.model.window_attn_skip_freq.emplace(1, '2');  // (layer numbers 2 and 4, counted from 1, attend fully)
  CHECK(attention_windows(c) == std::vector<int64_t>{3, -1, 3, -1});
  c.model.window_attn_skip_freq.emplace(1, '3');  // (no need to divide the layers: layer 3 only)
  CHECK(attention_windows(c) == std::vector<int64_t>{3, 3, -1, 3});
  c.model.window_attn_skip_freq = "[1,1]+[0,1]";  // (1: the window)
  CHECK(attention_windows(c) == std::vector<int64_t>{3, 3, -1, 3});
  c.model.window_size = "-1,0";  // (unbounded: none)
  CHECK(attention_windows(c).empty());
}

TEST_CASE("--window-size: the rules, and YAML") {
  Config c = base(4);
  c.model.window_size = "3,0";
  CHECK(diagnostics(c, 1).empty());
  c.model.window_size = "3,2";
  CHECK_THAT(diagnostics(c, 1), MT_CONTAINS("right bound must be 0"));
  c.model.window_size = "3;0";
  CHECK_THAT(diagnostics(c, 1), MT_CONTAINS("must be two integers"));
  c.model.window_size = "3,0";
  c.model.window_attn_skip_freq = "[1,0]";
  CHECK_THAT(diagnostics(c, 1), MT_CONTAINS("--window-attn-skip-freq '[1,0]' lists 2 layers, but --num-layers is 4"));
  c.model.window_attn_skip_freq.reset();
  c.parallel.context_parallel_size = 2;
  CHECK(diagnostics(c, 2).empty());  // (context parallelism: the CPU engine's blocks mask by the tokens' places; the CUDA engine refuses it)
  Config skip_only = base(4);
  skip_only.model.window_attn_skip_freq.emplace(1, '2');
  CHECK_THAT(diagnostics(skip_only, 1), MT_CONTAINS("warning: --window-attn-skip-freq without --window-size"));
  Config y = base(4);
  apply_yaml_text(y, "window_size: [127, 0]\nwindow_attn_skip_freq: [1, 1, 1, 0]\n", "test");
  CHECK(y.model.window_size == std::string("127,0"));
  CHECK(attention_windows(y) == std::vector<int64_t>{127, 127, 127, -1});
}

TEST_CASE("sliding-window attention in a model: a window spanning the sequence changes nothing, a narrow one does") {
  for (const bool llama : {false, true}) {
    Config plain = test::tiny_decoder(llama, 2);
    Config spanning = plain, narrow = plain, mixed = plain;
    spanning.model.window_size = "5,0";  // (6 tokens: every earlier key is inside)
    narrow.model.window_size = "1,0";
    mixed.model.window_size = "1,0";
    mixed.model.window_attn_skip_freq = "[0,1]";  // (the second layer only)
    auto loss = [](const Config& c) {
      GPTModel m(c, ProcessGroups::single());
      return m.forward(test::tiny_batch(), 1, false);
    };
    const float base_loss = loss(plain);
    CHECK(loss(spanning) == base_loss);
    CHECK(loss(narrow) != base_loss);
    CHECK(loss(mixed) != base_loss);
    CHECK(loss(mixed) != loss(narrow));
  }
}
