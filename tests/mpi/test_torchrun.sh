#!/usr/bin/env bash
# test_torchrun.sh: training launched torchrun-style (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, no
# MPI): the collectives go over TCP. The same losses as under mpirun; checkpoints (async too) resume exactly;
# a killed or stopped rank ends the others with a message; and, where PyTorch's torchrun is installed, a
# real torchrun launch (its static rendezvous holds MASTER_PORT: megatrain's moves to MASTER_PORT + 1).
# Usage: test_torchrun.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_torchrun.sh path/to/megatrain}")
T=$(dirname "$(realpath "$0")")/torchrun_style.sh
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
   --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style cosine --mock-data
   --vocab-size 128 --log-interval 1 --eval-iters 0 --train-iters 8 --seed 11 --device cpu)
L=(--tensor-model-parallel-size 2 --use-distributed-optimizer --sequence-parallel --overlap-grad-reduce)
losses() { grep -o '"lm_loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
close() {  # close A B: same number of losses, each within 1e-5 relative
  paste <(losses "$1") <(losses "$2") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR==0}' &&
    [[ $(losses "$1" | wc -l) -eq $(losses "$2" | wc -l) ]]
}

# 1. TP2 x DP2 + distributed optimizer + SP: torchrun-style equals mpirun.
"$T" 4 "$B" "${M[@]}" "${L[@]}" --log-dir "$tmp/t" >"$tmp/t.log" 2>&1; rc=$?
mpirun --oversubscribe --bind-to none -np 4 -x OPENBLAS_NUM_THREADS=1 "$B" "${M[@]}" "${L[@]}" --log-dir "$tmp/m" >/dev/null 2>&1
if [[ $rc -eq 0 ]] && grep -q "4 ranks (torchrun-style): TP 2 x DP 2, collectives over TCP" "$tmp/t.log" && close "$tmp/t" "$tmp/m"; then
  ok "TP2 x DP2 + distributed optimizer over TCP: the losses of mpirun"
else bad "TCP vs MPI: rc=$rc"; tail -3 "$tmp/t.log"; paste <(losses "$tmp/t") <(losses "$tmp/m"); fi

# 2. Checkpoints over TCP (async save, which under MPI needs MPI_THREAD_MULTIPLE): the resume continues
# exactly like the uninterrupted run.
"$T" 4 "$B" "${M[@]}" "${L[@]}" --save "$tmp/ck" --save-interval 2 --async-save --exit-interval 4 --log-dir "$tmp/s" >"$tmp/s.log" 2>&1; rc1=$?
"$T" 4 "$B" "${M[@]}" "${L[@]}" --load "$tmp/ck" --log-dir "$tmp/r" >"$tmp/r.log" 2>&1; rc2=$?
if [[ $rc1 -eq 0 && $rc2 -eq 0 && "$(losses "$tmp/t" | tail -4)" == "$(losses "$tmp/r")" && $(losses "$tmp/r" | wc -l) -eq 4 ]] &&
  grep -q "continuing after iteration 4" "$tmp/r.log" && "$B" checkpoint inspect "$tmp/ck" --verify >/dev/null 2>&1; then
  ok "async save at iterations 2, 4 and exact resume over TCP"
else bad "checkpoint over TCP: rc=$rc1/$rc2"; tail -3 "$tmp/s.log" "$tmp/r.log"; paste <(losses "$tmp/t" | tail -4) <(losses "$tmp/r"); fi

# 3. A rank killed (-9) or stopped: the others exit non-zero, naming what happened, within the bound.
fail_case() {  # name signal flags bound pattern (3 ranks of DP)
  local name=$1 sig=$2 flags=$3 bound=$4 pat=$5
  "$T" 3 "$B" "${M[@]}" --global-batch-size 6 --train-iters 100000 --log-dir "$tmp/$name" $flags >"$tmp/$name.log" 2>&1 &
  local lp=$!
  for _ in $(seq 1 300); do grep -q '"iteration":3,' "$tmp/$name/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
  local victim="" others=() p
  for p in $(pgrep -f "$tmp/$name"); do  # the ranks (not the launcher): by their RANK variable
    case $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep '^RANK=') in
      RANK=1) victim=$p ;;
      RANK=*) others+=("$p") ;;
    esac
  done
  if [[ -z $victim || ${#others[@]} -ne 2 ]]; then bad "$name: ranks not found"; pkill -KILL -f "$tmp/$name"; wait $lp; return; fi
  local t0=$SECONDS
  kill "-$sig" "$victim"
  # The survivors must end by themselves (torchrun's agent would also stop them once one exits).
  while (kill -0 "${others[0]}" || kill -0 "${others[1]}") 2>/dev/null && ((SECONDS - t0 <= bound + 30)); do sleep 0.5; done
  local dt=$((SECONDS - t0))
  kill -KILL "$victim" "${others[@]}" 2>/dev/null
  wait $lp; local rc=$?  # rank 0's exit status (the launcher reports the first non-zero, in rank order)
  if [[ $rc -ne 0 && $dt -le $bound ]] && grep -qE "$pat" "$tmp/$name.log"; then ok "$name: the other ranks exited (status $rc) after $dt s"; else
    bad "$name: rc=$rc after $dt s (bound $bound), pattern '$pat'"; tail -5 "$tmp/$name.log"; fi
}
fail_case killed KILL "" 60 "rank 1 \(world rank 1\) (closed|lost) its connection.*: it has probably failed"
fail_case stopped STOP "--distributed-timeout-seconds 5" 30 "waited more than 5 s: another rank has probably failed or stopped"

# 4. PyTorch's torchrun itself, where installed (its static rendezvous keeps MASTER_PORT for its agent store).
if command -v torchrun >/dev/null && torchrun --help >/dev/null 2>&1; then
  port=$((20000 + RANDOM % 12000))
  # --redirects / --tee given explicitly: Debian's torch 1.13 under Python 3.11 fails on their defaults.
  torchrun --nnodes 1 --nproc_per_node 2 --master_port "$port" --log_dir "$tmp/tr-logs" --redirects 1 --tee 1 --no_python \
    "$B" "${M[@]}" --tensor-model-parallel-size 2 --log-dir "$tmp/tr" >"$tmp/tr.log" 2>&1; rc=$?
  "$T" 2 "$B" "${M[@]}" --tensor-model-parallel-size 2 --log-dir "$tmp/tr2" >/dev/null 2>&1
  if [[ $rc -eq 0 ]] && close "$tmp/tr" "$tmp/tr2"; then ok "torchrun (static rendezvous on port $port, megatrain's on $((port + 1)))"; else
    bad "torchrun: rc=$rc"; grep -v '^\[default' "$tmp/tr.log" | tail -5; fi
else
  echo "skip PyTorch's torchrun (not installed): the torchrun-style launches above set its variables"
fi
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
