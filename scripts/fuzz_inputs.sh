#!/usr/bin/env bash
# fuzz_inputs.sh: builds the libFuzzer targets for what megatrain reads from outside (the .bin/.idx reader,
# checkpoint metadata, YAML recipes, tokenizer files: tokenizer.json, GPT-2 vocab.json / merges.txt and the text
# they encode, SentencePiece models) with clang (ASan + UBSan) and fuzzes each for a bounded time (default 60 s
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
# Tokenizers (ICU for the pre-tokenizer regexes, the SentencePiece library where installed).
ICU=(-DMEGATRAIN_HAVE_ICU_REGEX=1 -DMEGATRAIN_HAVE_ICU=1 -licui18n -licuuc -licudata)
mkdir -p "$out/corpus-hf_tokenizer" "$out/corpus-gpt2_bpe" "$out/corpus-sentencepiece"
"$CXX" "${FLAGS[@]}" tests/fuzz/fuzz_hf_tokenizer.cpp lib/data/hf_tokenizer.cpp lib/data/byte_level.cpp "${ICU[@]}" -o "$out/fuzz_hf_tokenizer"
"$CXX" "${FLAGS[@]}" tests/fuzz/fuzz_gpt2_bpe.cpp lib/data/gpt2_bpe.cpp lib/data/byte_level.cpp "${ICU[@]}" -o "$out/fuzz_gpt2_bpe"
cat >"$out/corpus-hf_tokenizer/seed-bytelevel" <<'JSON'
{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120a": 4}, "merges": ["a b", "\u0120 a"]},
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}, "added_tokens": [{"id": 5, "content": "<|end|>", "special": true}]}
JSON
echo '{"model": {"type": "BPE", "vocab": {"a": 0, "<0x41>": 1}, "merges": [], "byte_fallback": true}, "pre_tokenizer": {"type": "Metaspace"}}' \
  >"$out/corpus-hf_tokenizer/seed-metaspace"
printf '\0{"a": 0, "b": 1, "ab": 2}' >"$out/corpus-gpt2_bpe/seed-vocab"
printf '\1#version: 0.2\na b\nab c\n' >"$out/corpus-gpt2_bpe/seed-merges"
printf '\2Hello world, 123 ab abc! \xc3\xbc' >"$out/corpus-gpt2_bpe/seed-text"
targets=(checkpoint_metadata recipe hf_tokenizer gpt2_bpe)
if [[ -f /usr/include/sentencepiece_processor.h ]]; then
  "$CXX" "${FLAGS[@]}" -DMEGATRAIN_HAVE_SENTENCEPIECE=1 tests/fuzz/fuzz_sentencepiece.cpp lib/data/sentencepiece_tokenizer.cpp -lsentencepiece \
    -o "$out/fuzz_sentencepiece"
  if command -v spm_train >/dev/null; then
    head -c 20000 ../shared/data/tinyshakespeare.txt >"$out/spm-input.txt" 2>/dev/null || head -c 20000 README.md >"$out/spm-input.txt"
    spm_train --input="$out/spm-input.txt" --model_prefix="$out/corpus-sentencepiece/seed" --vocab_size=400 --model_type=bpe \
      --byte_fallback=true >/dev/null 2>&1 || true
    rm -f "$out/corpus-sentencepiece/seed.vocab"
  fi
  targets+=(sentencepiece)
else
  echo "fuzz sentencepiece: skipped (libsentencepiece-dev not installed)"
fi
for t in "${targets[@]}"; do
  "$out/fuzz_$t" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=5 "$out/corpus-${t/checkpoint_/}" 2>&1 | tail -3
  echo "fuzz $t: no crash in $SECONDS_TO_RUN s"
done
