// test_tensorboard.cpp: --tensorboard-dir writes event files TensorBoard can read: TFRecord framing with
// masked CRC-32C, Event / Summary messages decoded here field by field, Megatron's tags from a real run.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "catch.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "config/yaml_io.h"
#include "train/capabilities.h"
#include "train/tensorboard.h"
#include "train/trainer.h"

using namespace mt;

namespace {

struct Scalar {
  std::string tag;
  float value = 0;
  int64_t step = 0;
};

struct Reader {
  std::string s;
  size_t p = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(s.at(p++));
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, s.data() + p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string bytes() {
    const auto n = static_cast<size_t>(varint());
    std::string b = s.substr(p, n);
    p += n;
    return b;
  }
  bool done() const { return p >= s.size(); }
};

// Every record of an event file, CRCs checked; each Event's step, file_version and scalar values.
struct Events {
  std::vector<std::string> versions;
  std::vector<Scalar> scalars;
};

Events read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Events out;
  size_t p = 0;
  while (p < all.size()) {
    REQUIRE(p + 12 <= all.size());
    const std::string len_bytes = all.substr(p, 8);
    uint64_t len = 0;
    std::memcpy(&len, len_bytes.data(), 8);
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len_crc, all.data() + p + 8, 4);
    REQUIRE(len_crc == masked_crc32c(len_bytes));
    const std::string data = all.substr(p + 12, static_cast<size_t>(len));
    std::memcpy(&data_crc, all.data() + p + 12 + len, 4);
    REQUIRE(data_crc == masked_crc32c(data));
    p += 12 + static_cast<size_t>(len) + 4;
    Reader e{data};
    int64_t step = 0;
    while (!e.done()) {
      const uint64_t k = e.varint();
      const int field = static_cast<int>(k >> 3), wt = static_cast<int>(k & 7);
      if (field == 1 && wt == 1) {
        CHECK(e.fixed<double>() > 1.6e9);  // wall time, seconds since 1970
      } else if (field == 2 && wt == 0) {
        step = static_cast<int64_t>(e.varint());
      } else if (field == 3 && wt == 2) {
        out.versions.push_back(e.bytes());
      } else if (field == 5 && wt == 2) {
        Reader sum{e.bytes()};
        while (!sum.done()) {
          REQUIRE(sum.varint() == (1u << 3 | 2));
          Reader v{sum.bytes()};
          Scalar sc;
          sc.step = step;
          while (!v.done()) {
            const uint64_t vk = v.varint();
            if (vk == (1u << 3 | 2)) sc.tag = v.bytes();
            else if (vk == (2u << 3 | 5)) sc.value = v.fixed<float>();
            else FAIL("unexpected Summary.Value field " << vk);
          }
          out.scalars.push_back(sc);
        }
      } else {
        FAIL("unexpected Event field " << field << " wire type " << wt);
      }
    }
  }
  return out;
}

std::string only_event_file(const std::filesystem::path& dir) {
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().find("tfevents") != std::string::npos) files.push_back(f.path().string());
  }
  REQUIRE(files.size() == 1);
  return files[0];
}


// The quickstart recipe on the bundled Shakespeare bytes, writing TensorBoard events into dir (emptied first).
Config quickstart_with_tensorboard(const std::filesystem::path& dir) {
  std::filesystem::remove_all(dir);
  Config c;
  apply_yaml_file(c, std::string(MEGATRAIN_SOURCE_DIR) + "/configs/quickstart.yaml");
  c.data.text_data_path = std::string(MEGATRAIN_SOURCE_DIR) + "/tests/data/tinyshakespeare.txt";
  c.logging.tensorboard_dir = dir.string();
  return c;
}

// The scalars of dir's only event file, by tag, in the order written.
std::map<std::string, std::vector<Scalar>> scalars_by_tag(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<Scalar>> by_tag;
  for (const Scalar& s : read_events(only_event_file(dir)).scalars) by_tag[s.tag].push_back(s);
  return by_tag;
}

}  // namespace

TEST_CASE("CRC-32C and TFRecord's mask match their published values") {
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  // mask(crc) = rotate right by 15, plus 0xa282ead8
  const uint32_t c = crc32c("abc");
  CHECK(masked_crc32c("abc") == ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST_CASE("the TensorBoard writer frames and encodes scalar events") {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_tb_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  {
    TensorBoardWriter w(dir.string());
    w.scalar("lm loss", 2.5, 10);
    w.scalar("learning-rate vs samples", 3e-4, 1234567890123LL);
    w.flush();
  }
  const Events ev = read_events(only_event_file(dir));
  REQUIRE(ev.versions == std::vector<std::string>{"brain.Event:2"});
  REQUIRE(ev.scalars.size() == 2);
  CHECK(ev.scalars[0].tag == "lm loss");
  CHECK(ev.scalars[0].value == 2.5f);
  CHECK(ev.scalars[0].step == 10);
  CHECK(ev.scalars[1].tag == "learning-rate vs samples");
  CHECK(ev.scalars[1].value == Approx(3e-4));
  CHECK(ev.scalars[1].step == 1234567890123LL);
  std::filesystem::remove_all(dir);
  CHECK_THROWS_WITH(TensorBoardWriter("/proc/no-such-dir/tb"), MT_CONTAINS("--tensorboard-dir"));
}

TEST_CASE("a training run with --tensorboard-dir writes Megatron's scalars at each log line") {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_tb_run_" + std::to_string(::getpid()));
  Config c = quickstart_with_tensorboard(dir);
  c.training.train_iters = 6;
  c.logging.log_interval = 2;
  c.logging.eval_interval = 6;
  c.logging.eval_iters = 2;
  c.logging.log_validation_ppl_to_tensorboard = true;
  c.logging.log_throughput = true;
  c.logging.no_log_loss_scale_to_tensorboard = true;
  c.logging.log_timers_to_tensorboard = true;
  REQUIRE(validate(c, 1, Purpose::kTrain).ok());
  resolve(c, 1, 257);
  const TrainResult r = train(c, ProcessGroups::single(), {true, 0});
  auto by_tag = scalars_by_tag(dir);
  REQUIRE(by_tag["lm loss"].size() == 4);  // the first iteration (as Megatron logs it), then iterations 2, 4, 6
  CHECK(by_tag["lm loss"][0].step == 1);
  CHECK(by_tag["lm loss"][1].step == 2);
  CHECK(by_tag["lm loss"][3].step == 6);
  CHECK(by_tag["lm loss vs samples"][3].step == 6 * *c.training.global_batch_size);
  REQUIRE(r.losses.size() == 6);
  CHECK(by_tag["lm loss"][0].value == Approx(r.losses[0]).epsilon(1e-5));
  // (the first iteration's line ends no interval: iteration 2's still averages iterations 1 and 2)
  CHECK(by_tag["lm loss"][1].value == Approx((r.losses[0] + r.losses[1]) / 2).epsilon(1e-5));
  CHECK(by_tag["lm loss"][3].value == Approx((r.losses[4] + r.losses[5]) / 2).epsilon(1e-5));
  for (const char* tag : {"learning-rate", "grad-norm"}) {
    INFO(tag);
    CHECK(by_tag[tag].size() == 4);
  }
  // Megatron's timers (--log-timers-to-tensorboard at --timing-log-level 0): the iteration time, not at the run's first
  // iteration, and with --log-throughput the throughput, at every log line.
  REQUIRE(by_tag["iteration-time"].size() == 3);
  CHECK(by_tag["iteration-time"][0].step == 2);
  REQUIRE(by_tag["throughput"].size() == 4);
  CHECK(by_tag["throughput"][0].step == 1);
  CHECK(by_tag.count("loss-scale") == 0);  // --no-log-loss-scale-to-tensorboard
  CHECK(by_tag.count("batch-size") == 0);  // only with --log-batch-size-to-tensorboard, as Megatron
  // (the evaluation at iteration 6, the one after the last iteration, and the test split's, each under Megatron's
  // validation tags at the same step)
  REQUIRE(r.valid_losses.size() == 2);
  const auto& validation = by_tag["lm loss validation"];
  REQUIRE(validation.size() == 2 + r.test_losses.size());
  CHECK(validation[0].value == Approx(r.valid_losses[0]).epsilon(1e-5));
  CHECK(validation[1].value == Approx(r.valid_losses[1]).epsilon(1e-5));
  if (!r.test_losses.empty()) CHECK(validation[2].value == Approx(r.test_losses[0]).epsilon(1e-5));
  for (const auto& point : validation) CHECK(point.step == 6);
  CHECK(by_tag["lm loss validation ppl"].size() == validation.size());
  std::filesystem::remove_all(dir);
}

TEST_CASE("TensorBoard flags: GPU memory refused by name on the CPU engine, the timers (level 0) on both") {
  Config c;
  c.logging.tensorboard_dir = "tb";
  CHECK(unsupported_features(c, 1, false).empty());
  c.logging.log_timers_to_tensorboard = true;
  c.logging.log_memory_to_tensorboard = true;
  const auto gaps = unsupported_features(c, 1, false);
  REQUIRE(gaps.size() == 1);
  CHECK_THAT(gaps[0], MT_CONTAINS("--log-memory-to-tensorboard"));
  // GPU memory: the CUDA engine logs it (Megatron's mem-* tags), the CPU engine has none to log.
  CHECK(unsupported_features(c, 1, true).empty());
  c.logging.timing_log_level = 1;  // (the timers of levels 1 and 2 are Megatron's own code's)
  CHECK_THAT(unsupported_features(c, 1, true).front(), MT_CONTAINS("--timing-log-level > 0 is not implemented"));
}

// --moe-per-layer-logging (Megatron's track_moe_metrics with per_layer_logging): each auxiliary loss of the log line also
// per layer, tagged moe/<name>_layer_<i> over every layer of the model (a dense layer's 0), each layer's value averaged
// over the microbatches; the log line's value is their sum over the MoE layers' count.
TEST_CASE("--moe-per-layer-logging writes each layer's MoE losses to TensorBoard") {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_tb_moe_" + std::to_string(::getpid()));
  Config c = quickstart_with_tensorboard(dir);
  c.model.num_layers = 3;
  c.moe.num_experts = 4;
  c.moe.moe_router_topk = 2;
  c.moe.moe_ffn_hidden_size = 64;
  c.moe.moe_aux_loss_coeff = {1e-2};
  c.moe.moe_z_loss_coeff = 1e-3;
  c.moe.moe_layer_freq = "[1,0,1]";
  c.moe.moe_per_layer_logging = true;
  c.training.train_iters = 4;
  c.logging.log_interval = 2;
  c.logging.eval_interval = 100;
  REQUIRE(validate(c, 1, Purpose::kTrain).ok());
  resolve(c, 1, 257);
  train(c, ProcessGroups::single(), {true, 0});
  auto by_tag = scalars_by_tag(dir);
  for (const std::string name : {"load_balancing_loss", "z_loss"}) {
    INFO(name);
    REQUIRE(by_tag[name].size() == 3);  // the first iteration (as Megatron logs it), then iterations 2 and 4
    CHECK(by_tag.count("moe/" + name + "_layer_3") == 0);
    for (size_t k = 0; k < 3; ++k) {
      double sum = 0;
      for (int l = 0; l < 3; ++l) {
        const auto& layer = by_tag["moe/" + name + "_layer_" + std::to_string(l)];
        REQUIRE(layer.size() == 3);
        CHECK(layer[k].step == by_tag[name][k].step);
        if (l == 1) CHECK(layer[k].value == 0.0);  // the dense layer
        else CHECK(layer[k].value > 0.0);
        sum += layer[k].value;
      }
      CHECK(sum / 2.0 == Approx(by_tag[name][k].value).epsilon(1e-5));  // (two MoE layers)
    }
  }
  // The two MoE layers route differently, so their losses differ.
  CHECK(by_tag["moe/load_balancing_loss_layer_0"][2].value != by_tag["moe/load_balancing_loss_layer_2"][2].value);
  std::filesystem::remove_all(dir);
}
