#!/usr/bin/env bash
# test_comm_failure.sh TEST_COMM: a rank that dies in the middle of a batched exchange ends the others, with
# a message and a non-zero exit, within the timeout: under mpirun (the launcher) and torchrun-style (the TCP
# communicator names the dead rank).
set -u
T=${1:?usage: test_comm_failure.sh path/to/test_comm}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
here=$(cd "$(dirname "$0")" && pwd)
fail=0
out=$(timeout 90 mpirun --oversubscribe --bind-to none -np 3 "$T" --last-rank-dies 2>&1); rc=$?
if [[ $rc -eq 0 || $rc -eq 124 ]]; then echo "$out" | tail -5; echo "FAIL: mpirun with a dead rank: exit $rc (0: it completed, 124: it hung)"; fail=1; fi
out=$(timeout 90 bash "$here/torchrun_style.sh" 3 "$T" --last-rank-dies 2>&1); rc=$?
if [[ $rc -eq 0 || $rc -eq 124 ]]; then echo "$out" | tail -5; echo "FAIL: torchrun-style with a dead rank: exit $rc"; fail=1; fi
if ! grep -q "its rank 2 (world rank 2) closed its connection: it has probably failed" <<<"$out"; then
  echo "$out" | tail -5; echo "FAIL: the TCP ranks did not name the dead peer"; fail=1
fi
grep -q "FAIL the exchange with a dead rank completed" <<<"$out" && { echo "FAIL: an exchange with a dead rank completed"; fail=1; }
[[ $fail -eq 0 ]] && echo "PASS: a rank dying mid-exchange ends the others (MPI and TCP)"
exit $fail
