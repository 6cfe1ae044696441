#!/usr/bin/env bash
# test_rank_failure.sh: when one rank dies (kill -9) or stops answering (SIGSTOP), every other rank
# exits non-zero within the bound, with a message (a stopped rank named: it does not answer the others'
# question); nothing hangs (data parallel, and a pipeline stage).
# Usage: test_rank_failure.sh path/to/megatrain (from the repository root).
set -u
B=${1:?usage: test_rank_failure.sh path/to/megatrain}
fails=0
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/marker" 2>/dev/null; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
      --micro-batch-size 2 --global-batch-size 12 --train-iters 100000 --lr 1e-3 --mock-data --vocab-size 256
      --log-interval 1 --eval-iters 0 --tensor-model-parallel-size 1 --log-dir "$tmp/marker")

rank_pid() {  # the PID of world rank $1 among our processes
  for p in $(pgrep -f "$tmp/marker"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}

run_case() {  # run_case NAME SIGNAL TIMEOUT_FLAG BOUND PATTERN
  local name=$1 sig=$2 bound=$4 pat=$5
  mpirun --oversubscribe --bind-to none -np 3 -x OPENBLAS_NUM_THREADS=1 "$B" "${ARGS[@]}" $3 >"$tmp/$name.log" 2>&1 &
  local mp=$!
  for _ in $(seq 1 100); do grep -q "iteration        3/" "$tmp/$name.log" && break; sleep 0.2; done
  local victim; victim=$(rank_pid 1)
  if [[ -z $victim ]]; then echo "FAIL $name: rank 1 not found"; fails=$((fails + 1)); kill -9 $mp; return; fi
  local t0=$SECONDS
  kill "-$sig" "$victim"
  local waited=0
  while kill -0 $mp 2>/dev/null && ((waited < bound + 30)); do sleep 1; waited=$((waited + 1)); done
  if kill -0 $mp 2>/dev/null; then
    echo "FAIL $name: still running after $((bound + 30)) s"; kill -9 $mp; pkill -KILL -f "$tmp/marker"; fails=$((fails + 1)); return
  fi
  wait $mp; local rc=$? dt=$((SECONDS - t0))
  pkill -KILL -f "$tmp/marker" 2>/dev/null
  if [[ $rc -ne 0 && $dt -le $bound ]] && grep -qE "$pat" "$tmp/$name.log"; then
    echo "ok   $name: exit $rc after ${dt} s"
  else
    echo "FAIL $name: rc=$rc after ${dt} s (bound $bound s), pattern '$pat'"; tail -15 "$tmp/$name.log"; fails=$((fails + 1))
  fi
}

run_case killed KILL "" 60 "rank 1 .*(exited on signal 9|Killed)"
run_case stopped STOP "--distributed-timeout-seconds 5" 30 "waited more than 5 s in .* world rank 1 \(host .*, pid [0-9]+\) did not answer within 3 s"
# A pipeline stage (the middle one of three) killed or stopped in 1F1B's transfers.
PP="--num-layers 3 --pipeline-model-parallel-size 3"
run_case pp_killed KILL "$PP" 60 "rank 1 .*(exited on signal 9|Killed)"
run_case pp_stopped STOP "$PP --distributed-timeout-seconds 5" 30 "waited more than 5 s in .* world rank 1 \(host .*, pid [0-9]+\) did not answer within 3 s"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
