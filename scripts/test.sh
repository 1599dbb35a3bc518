#!/usr/bin/env bash
# The test suite (what CI runs after scripts/setup.sh). Starts the local Slurm when we are root and it is
# not up yet, so the Slurm tests run against real slurmctld/slurmd/slurmdbd; GPU tests skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
. .venv/bin/activate
if [ "$(id -u)" = 0 ] && ! sinfo >/dev/null 2>&1; then
  bash .ci/slurm-up.sh
fi
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
run_pytest() {
  set +e
  python -m pytest -q -ra --durations=15 "$@"
  local rc=$?
  set -e
  # pytest exits 5 when nothing was collected: that is a broken suite, not a pass.
  if [ "$rc" = 5 ]; then echo "no tests were collected: $*" >&2; return 1; fi
  return "$rc"
}
if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit $?
fi
# Lint and format (the pre-commit hooks' checks) before the suite: a failure here fails the run, after the tests.
rc=0
echo "ruff check, ruff format --check, structure (layers, import cycles, module and function length), generated reference"
ruff check --output-format concise . && ruff format --check --quiet . || rc=1
python scripts/check_structure.py || rc=1
python -m eagle_batch.reference --check || rc=1  # docs/reference/ matches the parsers and the schema
# The fault-injection suite forks task processes from the test process; it runs in a pytest process of
# its own so that no thread left behind by earlier in-process vLLM engines is inherited by a fork.
# Two pytest processes side by side (EB_TEST_SPLIT=0 runs one): the tests that start vLLM engines in one, one at
# a time (two CPU engines on two cores slow each other several-fold), with the tests marked engine_half that even
# the two halves' wall time, everything else in the other (the Slurm tests among them one at a time, as they share
# the one node). Each has a temporary folder of its own, so the local executor's machine-wide device slot
# (launch/local.py) does not make one's jobs wait for the other's; torch's compile cache stays the one shared
# folder. Their lines are prefixed [vllm] and [rest].
if [ "${EB_TEST_SPLIT:-1}" = 1 ]; then
  tmp=$(mktemp -d)
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/torchinductor_$(id -un)}
  # Each half runs in a session of its own (setsid): a test that signals its process group, as Slurm signals
  # every process of a job step, reaches that half's processes only, never this script or the other half; the
  # exit status of each comes from `wait` on its own process.
  export -f run_pytest
  pids=()
  for half in vllm rest; do
    mkdir -p "$tmp/$half"
    marks="vllm or engine_half"
    [ "$half" = rest ] && marks="not vllm and not engine_half"
    # shellcheck disable=SC2016  # $1 and $2 are the inner shell's arguments
    TMPDIR=$tmp/$half setsid --wait bash -c \
      'set -o pipefail; run_pytest -m "$1" --ignore=tests/faults 2>&1 | sed -u "s/^/[$2] /"' _ "$marks" "$half" &
    pids+=("$!")
  done
  i=0
  for half in vllm rest; do
    half_rc=0
    wait "${pids[$i]}" || half_rc=$?
    echo "[$half] exit $half_rc"
    [ "$half_rc" = 0 ] || rc=$half_rc
    i=$((i + 1))
  done
  rm -rf "$tmp"
else
  run_pytest --ignore=tests/faults || rc=$?
fi
run_pytest tests/faults || rc=$?
exit "$rc"
