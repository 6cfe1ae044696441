# shakespeare_documents.sh (sourced): the tests' preprocessed multi-document corpus. make_documents B DIR writes
# DIR/shakespeare_text_document.{bin,idx}: the first 60,000 bytes of Shakespeare, its speeches (blank-line separated)
# as documents, each with its end-of-document token (ByteTokenizer); DIR/pre.log names the documents' count.
make_documents() {
  local bin=$1 dir=$2
  head -c 60000 tests/data/tinyshakespeare.txt >"$dir/corpus.txt"
  "$bin" preprocess --input "$dir/corpus.txt" --output-prefix "$dir/shakespeare" --tokenizer-type ByteTokenizer --append-eod --workers 1 \
    >"$dir/pre.log" 2>&1 || { echo "FAIL preprocess"; cat "$dir/pre.log"; exit 1; }
}
