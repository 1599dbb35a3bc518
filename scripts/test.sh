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
echo "ruff check, ruff format --check, structure (import cycles, module and function length)"
ruff check --output-format concise . && ruff format --check --quiet . || rc=1
python scripts/check_structure.py || rc=1
# The fault-injection suite forks task processes from the test process; it runs in a pytest process of
# its own so that no thread left behind by earlier in-process vLLM engines is inherited by a fork.
# Two workers (EB_TEST_WORKERS; 1 runs serially): the tests that start vLLM engines run one at a time, and so do
# the other Slurm tests (tests/conftest.py); everything else runs beside them.
workers=${EB_TEST_WORKERS:-2}
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadgroup)
run_pytest "${parallel[@]}" --ignore=tests/faults || rc=$?
run_pytest tests/faults || rc=$?
exit "$rc"
