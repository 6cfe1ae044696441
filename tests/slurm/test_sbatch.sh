#!/usr/bin/env bash
# test_sbatch.sh: the sbatch scripts pass `bash -n`, and under a fake SLURM environment (a fake srun
# that records its arguments) they pre-flight with the real `megatrain plan` and build the expected
# command line. Usage: test_sbatch.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_sbatch.sh path/to/megatrain}")
root=$PWD
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin"
cat >"$tmp/bin/srun" <<'SRUN'
#!/usr/bin/env bash
printf '%s\n' "$*" >"$FAKE_SRUN_LOG"
SRUN
chmod +x "$tmp/bin/srun"

check() {  # check SCRIPT NODES TASKS_PER_NODE PATTERN...
  local script=$1 nodes=$2 per=$3; shift 3
  if ! bash -n "$root/slurm/$script"; then echo "FAIL bash -n $script"; fails=$((fails + 1)); return; fi
  local log="$tmp/$script.log" out
  out=$(cd "$root" && env PATH="$tmp/bin:$PATH" FAKE_SRUN_LOG="$log" MEGATRAIN="$B" SLURM_SUBMIT_DIR="$root" \
        SLURM_JOB_ID=1 SLURM_NNODES=$nodes SLURM_NTASKS=$((nodes * per)) SLURM_NTASKS_PER_NODE="$per(x$nodes)" \
        bash "$root/slurm/$script" 2>&1)
  local rc=$?
  if [[ $rc -ne 0 || ! -s $log ]]; then echo "FAIL $script: rc=$rc"; echo "$out" | tail -5; fails=$((fails + 1)); return; fi
  for pat in "$@"; do
    if ! grep -qE -- "$pat" "$log" && ! grep -qE -- "$pat" <<<"$out"; then
      echo "FAIL $script: '$pat' not in: $(cat "$log")"; fails=$((fails + 1)); return
    fi
  done
  echo "ok   $script"
}

check single-node.sbatch 1 8 "^--mpi=pmix .*megatrain --config configs/llama3-8b.yaml --save checkpoints/llama3-8b" \
  "world size 8 = TP 2 x PP 1 x CP 1 x DP 4"
check multi-node.sbatch 4 8 "megatrain --config configs/llama3-8b.yaml" "world size 32 = TP 2 x PP 1 x CP 1 x DP 16"
check llama3-70b-64gpu.sbatch 8 8 "--config configs/llama3-70b.yaml --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4" \
  "world size 64 = TP 4 x PP 4 x CP 1 x DP 4" "--async-save"
check mixtral-8x7b-32gpu.sbatch 4 8 "--config configs/mixtral-8x7b.yaml --tensor-model-parallel-size 2 --expert-model-parallel-size 4" \
  "expert grid: ETP 2 x EP 4 x expert-DP 4 x PP 1"

# A bad allocation fails before srun runs: 70B on 12 GPUs.
log="$tmp/bad.log"
out=$(cd "$root" && env PATH="$tmp/bin:$PATH" FAKE_SRUN_LOG="$log" MEGATRAIN="$B" SLURM_SUBMIT_DIR="$root" \
      SLURM_NNODES=3 SLURM_NTASKS=12 SLURM_NTASKS_PER_NODE=4 bash "$root/slurm/llama3-70b-64gpu.sbatch" 2>&1)
if [[ $? -ne 0 && ! -e $log ]] && grep -q "world size 12 is not divisible" <<<"$out"; then echo "ok   bad allocation stops before srun"; else
  echo "FAIL bad allocation: $out"; fails=$((fails + 1)); fi

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
