#!/usr/bin/env bash
# fuzz_indexed_dataset.sh: builds the .bin/.idx reader's libFuzzer target with clang (ASan + UBSan)
# and fuzzes it for a bounded time (default 60 s), seeded with a valid file. Needs clang and
# libclang-rt-dev (apt-get install clang libclang-rt-14-dev on Debian 12).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
CXX=${CLANGXX:-$(command -v clang++ || command -v clang++-14)}
out=build-fuzz
mkdir -p "$out/corpus"
"$CXX" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib tests/fuzz/fuzz_indexed_dataset.cpp \
  lib/data/indexed_dataset.cpp -o "$out/fuzz_indexed_dataset"
# Seed: two documents in Megatron's layout (cut marker + .idx + .bin).
printf '\x00\x52MMIDIDX\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x08\x02\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00\x02\x00\x03\x00\xff\xff\x07\x00' >"$out/corpus/seed"
"$out/fuzz_indexed_dataset" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 "$out/corpus" 2>&1 | tail -5
echo "fuzz: no crash in $SECONDS_TO_RUN s"
