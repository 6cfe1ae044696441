#!/usr/bin/env bash
# run_nccl_tests.sh: the NCCL communicator under mpirun and under torchrun-style variables (TCP
# rendezvous), one process per visible GPU (at least 1, at most 8). Exit 77 without a GPU.
set -u
T=${1:?usage: run_nccl_tests.sh path/to/test_nccl}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ ${n:-0} -eq 0 ]]; then echo "SKIP: no GPU visible: GPU tests run on the GPU machine (scripts/test_gpu.sh)"; exit 77; fi
((n > 8)) && n=8
fails=0
mpirun --oversubscribe --bind-to none -np "$n" -x NCCL_NVLS_ENABLE "$T" || fails=$((fails + 1))
port=$((29500 + RANDOM % 1000))
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$T" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
