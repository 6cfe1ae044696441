#!/usr/bin/env bash
# torchrun_style.sh N COMMAND...: runs N copies of COMMAND the way torchrun starts its workers (RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no MPI). MASTER_PORT: random below
# the kernel's ephemeral ports (32768 on), or TORCHRUN_STYLE_PORT. Exit status: the first non-zero one of the copies.
set -u
n=${1:?usage: torchrun_style.sh N COMMAND...}
shift
port=${TORCHRUN_STYLE_PORT:-$((20000 + RANDOM % 12000))}
pids=()
for ((r = 0; r < n; ++r)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || { s=$?; [[ $rc -eq 0 ]] && rc=$s; }
done
exit $rc
