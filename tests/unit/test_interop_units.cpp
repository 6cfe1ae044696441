// test_interop_units.cpp: pieces of the HuggingFace interop checked by hand: MXFP4 groups (the OCP MX format as
// transformers stores GPT-OSS's experts) decoded value by value; and the flat buffers' alignment that an odd-sized
// parameter (the attention sinks' [heads]) must not break.
#include <cmath>
#include <cstdint>
#include <vector>

#include "catch.h"
#include "config/errors.h"
#include "interop/mxfp4.h"
#include "model/params.h"

using namespace mt;

TEST_CASE("MXFP4: E2M1 codes, the low nibble first, times 2^(scale - 127)") {
  // Two rows of one group each: row 0 at scale 2^1, row 1 at 2^-3.
  std::vector<uint8_t> blocks(32, 0), scales = {128, 124};
  blocks[0] = 0x21;   // low 1 (0.5), high 2 (1.0)
  blocks[1] = 0xF9;   // low 9 (-0.5), high 15 (-6)
  blocks[15] = 0x7E;  // low 14 (-4), high 7 (6)
  blocks[16] = 0x53;  // row 1: low 3 (1.5), high 5 (3)
  blocks[31] = 0x84;  // low 4 (2), high 8 (-0)
  const std::vector<float> v = mxfp4_dequantize(blocks, scales, 2, 1, "test");
  REQUIRE(v.size() == 64);
  CHECK(v[0] == 1.0f);
  CHECK(v[1] == 2.0f);
  CHECK(v[2] == -1.0f);
  CHECK(v[3] == -12.0f);
  CHECK(v[4] == 0.0f);
  CHECK(v[30] == -8.0f);
  CHECK(v[31] == 12.0f);
  CHECK(v[32] == 1.5f / 8);
  CHECK(v[33] == 3.0f / 8);
  CHECK(v[62] == 2.0f / 8);
  CHECK(v[63] == 0.0f);
  CHECK(std::signbit(v[63]));
  // Every code at scale 2^0: the E2M1 table.
  std::vector<uint8_t> all(16), one = {127};
  for (int b = 0; b < 8; ++b) all[static_cast<size_t>(b)] = static_cast<uint8_t>((2 * b) | ((2 * b + 1) << 4));
  const std::vector<float> table = mxfp4_dequantize(all, one, 1, 1, "table");
  const float expect[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) CHECK(table[static_cast<size_t>(c)] == expect[c]);
  // A NaN scale is a damaged checkpoint, named.
  scales[1] = 255;
  CHECK_THROWS_AS(mxfp4_dequantize(blocks, scales, 2, 1, "w_blocks"), DataError);
}

TEST_CASE("ParamStore: every parameter starts on the alignment, the gaps belong to no parameter") {
  ParamStore store;
  auto add = [&](const char* name, int64_t n, GradGroup group) {
    ParamInfo p;
    p.name = name;
    p.global_shape = p.local_shape = {n};
    p.grad_group = group;
    return store.add(p);
  };
  const size_t a = add("a", 16, GradGroup::kDense), sinks = add("sinks", 4, GradGroup::kDense), b = add("b", 24, GradGroup::kDense);
  const size_t e = add("expert", 8, GradGroup::kExpert);
  store.allocate();
  for (size_t i = 0; i < store.size(); ++i) CHECK(store.info(i).offset % kParamAlignment == 0);
  CHECK(store.info(a).offset == 0);
  CHECK(store.info(sinks).offset == 16);
  CHECK(store.info(b).offset == 24);  // (4 zeros after the sinks)
  CHECK(store.info(e).offset == 48);
  CHECK(store.group_range(GradGroup::kDense) == std::pair<int64_t, int64_t>{0, 48});
  CHECK(store.group_range(GradGroup::kExpert) == std::pair<int64_t, int64_t>{48, 56});
  CHECK(store.numel() == 56);
}
