# shellcheck shell=bash
# What the scripts that drive the installed CLI on the device (user_path.sh, kimi.sh, draft_quality.sh) share;
# sourced after they set `out` (results), `work` (scratch) and `repo` (this checkout), with NAME (the log's
# name and tag).
#
# The environment: the vLLM bundle's site-packages where it is unpacked (/root/site; /root/extra holds wheels
# added to it), offline, eagle-batch's console script from $work/pkg first on PATH.
if [ -d /root/site ]; then
  export PYTHONPATH=/root/extra:/root/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PATH=$work/pkg/bin:$PATH PYTHONPATH=$work/pkg${PYTHONPATH:+:$PYTHONPATH}

say() { echo "[$NAME $(date -u +%T)] $*" | tee -a "$out/$NAME.log"; }

# step NAME CMD...: the command as typed, its output in OUT/NAME.txt, its wall time in OUT/times.tsv
step() {
  local name=$1; shift
  say "\$ $*"
  local t0 rc=0
  t0=$(date +%s%N)
  "$@" > "$out/$name.txt" 2>&1 || rc=$?
  echo -e "$name\t$(( ($(date +%s%N) - t0) / 1000000 )) ms\texit $rc" >> "$out/times.tsv"
  tail -n 25 "$out/$name.txt"
  say "$name: exit $rc"
  return $rc
}

# The machine and the versions the results come from (printed; the caller redirects into OUT/env.txt).
print_versions() {
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, vllm, torch, transformers, zarr; print('python', sys.version.split()[0], 'vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'zarr', zarr.__version__)"
}

# eagle-batch installed as a user installs it, so `eagle-batch` is the console script; from a clean copy of
# the sources (an in-tree build would reuse a stale build/ folder).
install_eagle_batch() {
  rm -rf "$work/src" "$work/pkg" && mkdir -p "$work/src"
  cp -r "$repo/eagle_batch" "$repo/pyproject.toml" "$repo/README.md" "$work/src/"
  python3 -m pip install -q --no-deps --no-index --no-build-isolation --target "$work/pkg" "$work/src"
}
