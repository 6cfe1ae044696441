#!/usr/bin/env bash
# test_sentencepiece.sh: Megatron's SentencePiece tokenizers in `megatrain preprocess` against the distribution's
# spm_encode, on SentencePiece models trained here (spm_train, BPE and unigram, byte fallback) on
# tinyshakespeare: every line of it and edge cases give spm_encode's ids (GPTSentencePieceTokenizer), with <s>
# first (Llama2Tokenizer); SentencePieceTokenizer's added special tokens (<CLS> <SEP> <EOD> <MASK> <PAD> after
# the model's pieces) split the text and take their ids; the end-of-document ids; a short training run on the
# preprocessed data; a file that is not a model is refused by name.
# Usage: test_sentencepiece.sh path/to/megatrain (from the repository root).
set -u
B=${1:?usage: test_sentencepiece.sh path/to/megatrain}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
command -v spm_train >/dev/null || { echo "FAIL: spm_train / spm_encode are missing (apt-get install sentencepiece; scripts/setup.sh does)"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node is not installed (scripts/setup.sh / .ci/run install it)"; exit 1; }
# Documents: each non-empty line of tinyshakespeare, and edge cases (Unicode, emoji, digits, whitespace runs).
grep -v '^$' tests/data/tinyshakespeare.txt >"$tmp/lines.txt"
cat >>"$tmp/lines.txt" <<'TXT'
Café naïve résumé — “quoted” ‘single’ ½ ﬁ
  leading and   inner   spaces  
日本語のテキストと emoji 🙂👍🏽 mixed in
12345 67.89 0x1F a+b=c <tag> & ; \ backslash
TXT
node -e 'const fs=require("fs");const l=fs.readFileSync(process.argv[1],"utf-8").split("\n").filter(x=>x.length);
  fs.writeFileSync(process.argv[2],l.map(t=>JSON.stringify({text:t})).join("\n")+"\n")' "$tmp/lines.txt" "$tmp/docs.jsonl"
for kind in bpe unigram; do
  spm_train --input tests/data/tinyshakespeare.txt --model_prefix "$tmp/$kind" --vocab_size 800 --model_type "$kind" \
    --character_coverage 1.0 --byte_fallback true >"$tmp/$kind.train.log" 2>&1 || { cat "$tmp/$kind.train.log"; bad "spm_train $kind"; continue; }
  spm_encode --model "$tmp/$kind.model" --output_format id <"$tmp/lines.txt" |
    node -e 'const l=require("fs").readFileSync(0,"utf-8").split("\n");l.pop();
      console.log(l.map(x=>JSON.stringify(x.trim()?x.trim().split(" ").map(Number):[])).join("\n"))' >"$tmp/$kind.ref.jsonl"
  for tok in GPTSentencePieceTokenizer Llama2Tokenizer; do
    "$B" preprocess --input "$tmp/docs.jsonl" --output-prefix "$tmp/$kind-$tok" --tokenizer-type $tok --tokenizer-model "$tmp/$kind.model" \
      --workers 2 >"$tmp/pp.log" 2>&1 || { cat "$tmp/pp.log"; bad "preprocess $kind $tok"; continue; }
    node "$here/read_indexed.js" "$tmp/$kind-${tok}_text_document" >"$tmp/got.jsonl"
    want="$tmp/$kind.ref.jsonl"
    if [[ $tok == Llama2Tokenizer ]]; then  # <s> (id 1) first
      sed 's/^\[/[1,/; s/^\[1,\]$/[1]/' "$tmp/$kind.ref.jsonl" >"$tmp/want.jsonl"; want="$tmp/want.jsonl"
    fi
    if cmp -s "$want" "$tmp/got.jsonl"; then ok "$kind $tok: $(wc -l <"$want") documents, ids identical to spm_encode's"
    else bad "$kind $tok: ids differ from spm_encode's"; diff "$want" "$tmp/got.jsonl" | head -6; fi
  done
done
# End of document: GPTSentencePieceTokenizer </s> (2) last; Llama2Tokenizer <s> first and </s> last.
printf '{"text": "To be, or not to be"}\n' >"$tmp/one.jsonl"
"$B" preprocess --input "$tmp/one.jsonl" --output-prefix "$tmp/eod-gpt" --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model "$tmp/bpe.model" --append-eod >/dev/null 2>&1
node "$here/read_indexed.js" "$tmp/eod-gpt_text_document" | grep -q ',2\]$' && ok "GPTSentencePieceTokenizer appends </s> (2)" || bad "GPTSentencePieceTokenizer --append-eod"
"$B" preprocess --input "$tmp/one.jsonl" --output-prefix "$tmp/eod-l2" --tokenizer-type Llama2Tokenizer --tokenizer-model "$tmp/bpe.model" --append-eod >/dev/null 2>&1
node "$here/read_indexed.js" "$tmp/eod-l2_text_document" | grep -q '^\[1,.*,2\]$' && ok "Llama2Tokenizer: <s> first, </s> last" || bad "Llama2Tokenizer --append-eod"
# SentencePieceTokenizer: the model has 800 pieces (<unk> 0, <s> 1, </s> 2, no pad): <CLS> 800, <SEP> 801, <EOD> 802,
# <MASK> 803, <PAD> 804; <s> and </s> are the model's. "<EOD>" inside a text is its id; the text around it the model's.
printf '{"text": "To be<EOD>or not<MASK>"}\n' >"$tmp/special.jsonl"
"$B" preprocess --input "$tmp/special.jsonl" --output-prefix "$tmp/sp" --tokenizer-type SentencePieceTokenizer --tokenizer-model "$tmp/bpe.model" --append-eod >/dev/null 2>&1
a=$(printf 'To be\n' | spm_encode --model "$tmp/bpe.model" --output_format id | tr ' ' ',')
b=$(printf 'or not\n' | spm_encode --model "$tmp/bpe.model" --output_format id | tr ' ' ',')
got=$(node "$here/read_indexed.js" "$tmp/sp_text_document")
[[ "$got" == "[$a,802,$b,803,802]" ]] && ok "SentencePieceTokenizer: special tokens in the text and <EOD> (802) appended" ||
  bad "SentencePieceTokenizer: got $got, want [$a,802,$b,803,802]"
# Training on the preprocessed data (the vocabulary from the tokenizer).
"$B" --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2 \
  --global-batch-size 2 --train-iters 5 --lr 1e-3 --data-path "$tmp/bpe-Llama2Tokenizer_text_document" --tokenizer-type Llama2Tokenizer \
  --tokenizer-model "$tmp/bpe.model" --eval-iters 0 --device cpu --log-interval 5 >"$tmp/train.log" 2>&1 &&
  grep -q "iteration *5/" "$tmp/train.log" && ok "training on Llama2Tokenizer data" || { tail -3 "$tmp/train.log"; bad "training on Llama2Tokenizer data"; }
# Not a model: one line naming the file.
out=$("$B" preprocess --input "$tmp/one.jsonl" --output-prefix "$tmp/x" --tokenizer-type Llama2Tokenizer --tokenizer-model "$tmp/one.jsonl" 2>&1) &&
  bad "a JSON file accepted as a SentencePiece model"
grep -q "one.jsonl is not a SentencePiece model" <<<"$out" && ok "a file that is not a model: refused by name" || bad "not a model: $out"
[[ $fails == 0 ]] && echo "all SentencePiece checks passed"
exit $((fails > 0))
