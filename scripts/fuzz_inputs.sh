#!/usr/bin/env bash
# fuzz_inputs.sh: builds the libFuzzer targets for what megatrain reads from outside (the .bin/.idx reader,
# checkpoint metadata, YAML recipes) with clang (ASan + UBSan) and fuzzes each for a bounded time (default 60 s
# each), seeded with valid inputs. Needs clang and libclang-rt-dev (apt-get install clang libclang-rt-14-dev).
# Usage: scripts/fuzz_inputs.sh [seconds per target]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
CXX=${CLANGXX:-$(command -v clang++ || command -v clang++-14)}
out=build-fuzz
FLAGS=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ilib)
scripts/fuzz_indexed_dataset.sh "$SECONDS_TO_RUN"
mkdir -p "$out/corpus-metadata" "$out/corpus-recipe"
"$CXX" "${FLAGS[@]}" tests/fuzz/fuzz_checkpoint_metadata.cpp lib/checkpoint/metadata_check.cpp -o "$out/fuzz_checkpoint_metadata"
"$CXX" "${FLAGS[@]}" tests/fuzz/fuzz_recipe.cpp lib/config/yaml_io.cpp lib/config/flags.cpp -lyaml-cpp -o "$out/fuzz_recipe"
cat >"$out/corpus-metadata/seed" <<'JSON'
{"iteration": 2, "consumed_samples": 32, "skipped_iterations": 0, "nan_iterations": 0, "flops_so_far": 1.5,
 "optimizer": {"saved": true, "kind": "adam", "step": 2}, "loss_scaler": {"scale": 1.0, "hysteresis_left": 2, "clean_steps": 0},
 "config": "num_layers: 2\n", "tensors": {"w": {"global_shape": [4, 2], "shards": [{"file": "rank_00000.bin", "offset": 0, "bytes": 32,
 "kind": "param", "checksum": "0", "global_shape": [4, 2], "local_shape": [4, 2], "shard_dim": -1, "shard_rank": 0, "shard_count": 1,
 "range": [0, 8]}]}}}
JSON
cp configs/quickstart.yaml "$out/corpus-recipe/seed"
for t in checkpoint_metadata recipe; do
  "$out/fuzz_$t" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=5 "$out/corpus-${t/checkpoint_/}" 2>&1 | tail -3
  echo "fuzz $t: no crash in $SECONDS_TO_RUN s"
done
