# common.sh: sourced by the sbatch scripts. Checks the layout with `megatrain plan` before the job
# spends GPU time, then launches one megatrain process per GPU with srun.
# MEGATRAIN: the binary (default: build/bin/megatrain under the submit directory, else megatrain on PATH).
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$PWD}"
if [[ -z "${MEGATRAIN:-}" ]]; then
  if [[ -x build/bin/megatrain ]]; then MEGATRAIN=build/bin/megatrain; else MEGATRAIN=megatrain; fi
fi
: "${SLURM_NNODES:?run this script with sbatch (SLURM_NNODES is not set)}"
: "${SLURM_NTASKS:?run this script with sbatch (SLURM_NTASKS is not set)}"

megatrain_launch() {
  # Pre-flight: the factorisation and memory per GPU for this allocation, on the batch host.
  "$MEGATRAIN" plan --world-size "$SLURM_NTASKS" --gpus-per-node "${SLURM_NTASKS_PER_NODE%%(*}" --no-groups "$@"
  local cmd=(srun --mpi=pmix --cpu-bind=none --kill-on-bad-exit=1 "$MEGATRAIN" "$@")
  echo "megatrain: ${cmd[*]}"
  "${cmd[@]}"
}
