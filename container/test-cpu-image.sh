#!/usr/bin/env bash
# Build the cpu flavour of the image (container/Dockerfile with container/versions-cpu.env) with podman
# and run it: `eagle-batch --help`, the entrypoint's cache and environment set-up, and a short real
# pipeline (prepare -> extract -> aggregate -> train on the real SmolLM2-135M, the run directory
# bind-mounted from the host), then check the outputs from the host with the repository's venv.
#
#   bash container/test-cpu-image.sh [WORK]      # WORK default /var/tmp/eagle-batch-image-test
#
# For a 2-core Debian 12 machine without a GPU or a container registry, as root: apt-get installs
# podman, runc and debootstrap when missing; the base comes from Debian's mirror (build.sh base), the
# Python packages from PyPI, torch+cpu from this machine's pip configuration (build.sh wheels).
# scripts/setup.sh provides the venv for the host-side checks and the SmolLM2 folder (run when absent).
# Nothing in the containers reaches a network (--network none): no model hub, no index.
# Where `apptainer` is on PATH, the .sif is built from the OCI image and run too.
#
# WORK keeps podman's storage (the base and the image's layers, ~5 GB), so a second run reuses them;
# REBUILD=1 removes the image and the base first. With a new WORK on the 2-core machine (shared, load
# 6-9): 11.5 min in all (base 99 s, build 273 s, pipeline in the image 304 s; 3.6 min again with the
# image cached); add about 20 s for the apt packages and scripts/setup.sh's time on a machine that has
# neither. Not part of .ci/run: that would take CI from ~20 to ~32 min and download ~0.9 GB each run
# (docs/how-to/container.md section 7).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mkdir -p "${1:-/var/tmp/eagle-batch-image-test}" && cd "${1:-/var/tmp/eagle-batch-image-test}" && pwd)"
build=(bash "${repo}/container/build.sh" --flavour cpu)

t0=${SECONDS}
stage_start=${SECONDS}
timings=()
stage() { # stage NAME: close the previous stage's clock, print a header
    if [[ -n "${stage_name:-}" ]]; then timings+=("$(printf '%-28s %5d s' "${stage_name}" $((SECONDS - stage_start)))"); fi
    stage_name="$1"
    stage_start=${SECONDS}
    [[ -n "${stage_name}" ]] && echo "== ${stage_name}"
    return 0
}
fail() { echo "test-cpu-image.sh: FAILED: $*" >&2; exit 1; }

stage "host tools"
missing=()
for tool in podman runc debootstrap; do command -v "${tool}" >/dev/null || missing+=("${tool}"); done
if ((${#missing[@]})); then
    [[ "$(id -u)" == 0 ]] || fail "missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [[ ! -x "${repo}/.venv/bin/eagle-batch" ]]; then bash "${repo}/scripts/setup.sh"; fi
# shellcheck disable=SC1091
. "${repo}/.venv/bin/activate"
export PYTHONPATH="${repo}" HF_HUB_OFFLINE=1

# podman configuration of this script's own (the machine's /etc/containers is left alone):
# - runc (Debian's package), the runtime these settings work with; crun fails here on the rlimits and
#   on the host's hybrid cgroups (as reported in issue 27; not installed here);
# - default_ulimits = []: podman's default raises RLIMIT_NOFILE, which this host refuses ("runc create
#   failed: ... error setting rlimit type 7: operation not permitted");
# - cgroupfs: no systemd manages the host's cgroups (v1 here); podman would pick it too, set explicitly;
# - overlay storage (STORAGE_DRIVER=vfs works too, but copies the whole tree at every build step and
#   deletes it again: with this 5 GB image, deleting one step's copy alone took minutes here).
# Builds run with --isolation chroot and the host's network (no CNI/netavark plugin is installed).
mkdir -p "${work}/podman"
cat >"${work}/podman/containers.conf" <<'EOF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
EOF
cat >"${work}/podman/storage.conf" <<EOF
[storage]
driver = "${STORAGE_DRIVER:-overlay}"
runroot = "${work}/podman/run"
graphroot = "${work}/podman/storage"
EOF
export CONTAINERS_CONF="${work}/podman/containers.conf" CONTAINERS_STORAGE_CONF="${work}/podman/storage.conf"
export WHEELS_DIR="${work}/wheels"
# pip inside the build trusts what this machine's pip trusts: where the network re-signs TLS, only the
# host's bundle holds that CA (build.sh passes it as a build secret; it is not copied into the image).
export BUILD_CA_BUNDLE="${BUILD_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"

image="localhost/$("${build[@]}" print | sed -n 's/^image=//p')"
base="$("${build[@]}" print | sed -n 's/^BASE_IMAGE=//p')"
if [[ "${REBUILD:-0}" == 1 ]]; then
    podman rmi -f "${image}" "${base}" >/dev/null 2>&1 || true
fi

stage "base (debootstrap + import)"
"${build[@]}" base

stage "image build (podman)"
"${build[@]}" podman --isolation chroot --network host >"${work}/build.log" 2>&1 \
    || { tail -40 "${work}/build.log" >&2; fail "podman build; the whole log is ${work}/build.log"; }
podman image inspect --format '{{.Size}}' "${image}" | awk '{printf "image size: %.1f GB\n", $1 / 1e9}'

# Every container of this script: no network (nothing may be downloaded at run time), the image's own
# user and entrypoint unless a check says otherwise.
run() { podman run --rm --network none "$@"; }

stage "eagle-batch --help"
help_out="$(run "${image}")"
for cmd in prepare extract status resume aggregate verify train; do
    grep -qw "${cmd}" <<<"${help_out}" || fail "'eagle-batch --help' (the image's default command) does not list ${cmd}"
done
version="$(run "${image}" --version)"
[[ "${version}" == *0.1.0* ]] || fail "eagle-batch --version printed '${version}'"

stage "entrypoint: caches, env"
# A probe named eagle-batch ahead of the real one on PATH records what the entrypoint hands over
# (environment, user, which python3), then execs the real command. The entrypoint itself is unchanged.
mkdir -p "${work}/probe"
cat >"${work}/probe/eagle-batch" <<'EOF'
#!/bin/sh
env | sort
echo "uid=$(id -u)"
echo "python3=$(command -v python3) prefix=$(python3 -c 'import sys; print(sys.prefix)')"
exec /opt/venv/bin/eagle-batch "$@"
EOF
chmod 0755 "${work}/probe/eagle-batch"
rm -rf "${work}/cache" && mkdir -p "${work}/cache" && chmod 1777 "${work}/cache"
# PATH without the venv, as a runtime that keeps the host's PATH (pyxis/enroot may) passes it: plain
# `python3` must still be the venv's (the /usr/local/bin/python3 wrapper).
probe=(-v "${work}/probe:/probe:ro" -e PATH=/probe:/usr/local/bin:/usr/bin:/bin)
env_out="$(run "${probe[@]}" -v "${work}/cache:/cache" "${image}" --version)"
want_env() { grep -qx "$1" <<<"${env_out}" || fail "entrypoint: expected '$1' in the environment, got: $(grep "^${1%%=*}=" <<<"${env_out}" || echo unset)"; }
want_env "EAGLE_BATCH_CACHE=/cache"
for kv in VLLM_CACHE_ROOT=vllm TRITON_CACHE_DIR=triton TORCHINDUCTOR_CACHE_DIR=inductor \
    FLASHINFER_WORKSPACE_BASE=flashinfer TORCH_EXTENSIONS_DIR=torch_extensions TVM_FFI_CACHE_DIR=tvm-ffi \
    CUDA_CACHE_PATH=cuda HF_HOME=hf XDG_CACHE_HOME=xdg; do
    want_env "${kv%%=*}=/cache/${kv#*=}"
    # Created by the entrypoint, as the image's user, in the folder bound from the host.
    [[ "$(stat -c %u "${work}/cache/${kv#*=}" 2>/dev/null)" == 10001 ]] \
        || fail "entrypoint: ${work}/cache/${kv#*=} was not created by uid 10001"
done
want_env "HF_HUB_OFFLINE=1"
want_env "uid=10001"
want_env "python3=/usr/local/bin/python3 prefix=/opt/venv"
# A value set by the caller wins (a site moving one cache, or EAGLE_BATCH_CACHE to a shared folder).
env_out="$(run "${probe[@]}" -e EAGLE_BATCH_CACHE=/tmp/eb -e TRITON_CACHE_DIR=/tmp/triton "${image}" --version)"
want_env "VLLM_CACHE_ROOT=/tmp/eb/vllm"
want_env "TRITON_CACHE_DIR=/tmp/triton"
# An unwritable cache folder is one line naming what to do, and the command still runs.
err="$(run -v "${work}/cache:/cache:ro" -e EAGLE_BATCH_CACHE=/cache/sub "${image}" --version 2>&1 >/dev/null)"
[[ "${err}" == *"cannot create caches under /cache/sub; mount a writable folder there"* ]] \
    || fail "entrypoint with a read-only cache printed '${err}'"

stage "pipeline in the image"
# The run directory and the data are bound at their host paths (as the launchers bind them on a
# cluster), so the host reads the run with the same paths; the model at the image's /models (its host
# folder is below root's home, which the image's user cannot traverse). Model and data read-only. The
# run directory belongs to the image's user (uid 10001), which writes every output.
model="$(python -m eagle_batch.models.smollm2)"
[[ -f "${model}/config.json" ]] || fail "no SmolLM2 folder at '${model}' (bash scripts/setup.sh makes it)"
run_dir="${work}/run"
rm -rf "${run_dir}" "${work}/data" && mkdir -p "${run_dir}" "${work}/data"
chown 10001:10001 "${run_dir}"
head -n "${CHATS:-48}" "${repo}/eagle_batch/demo_data/chat.jsonl" >"${work}/data/chat.jsonl"
pipeline=(
    -v "${run_dir}:${run_dir}" -v "${model}:/models/SmolLM2-135M-Instruct:ro" -v "${work}/data:${work}/data:ro"
    -v "${work}/cache:/cache"
    -e VLLM_CPU_KVCACHE_SPACE=1 -e VLLM_ENABLE_V1_MULTIPROCESSING=0 -e TOKENIZERS_PARALLELISM=false
)
# The demo's settings (CPU: fp32, eager, one task at a time) on fewer chats, two array tasks and a few
# training steps: every stage runs for real, briefly.
overrides=(
    "run_dir=${run_dir}" model.path=/models/SmolLM2-135M-Instruct "data.inputs=[${work}/data/chat.jsonl]"
    slurm.executor=local extract.num_tasks=2 "train.steps=${TRAIN_STEPS:-12}" train.log_every=4
    train.checkpoint_every=1000
)
run "${pipeline[@]}" "${image}" prepare configs/demo.yaml "${overrides[@]}"
run "${pipeline[@]}" "${image}" extract configs/demo.yaml "${overrides[@]}" --wait
run "${pipeline[@]}" "${image}" aggregate "${run_dir}"
run "${pipeline[@]}" "${image}" train configs/demo.yaml "${overrides[@]}" --local

stage "host-side checks"
# Before the host touches the run: everything in it was written by the image's user.
not_ours="$(find "${run_dir}" -mindepth 1 ! -uid 10001 | head -5)"
[[ -z "${not_ours}" ]] || fail "files in the run directory not written by the container's uid 10001: ${not_ours}"
# The host's eagle-batch (the repository's venv) reads what the image wrote.
eagle-batch status "${run_dir}"
eagle-batch verify "${run_dir}"
python - "${run_dir}" <<'EOF'
import json, math, subprocess, sys
from pathlib import Path

from safetensors.torch import load_file

run = Path(sys.argv[1])
st = json.loads(subprocess.run(["eagle-batch", "status", str(run), "--json"], check=True, capture_output=True, text=True).stdout)
tasks = st["tasks"]
assert len(tasks) == 2, f"expected 2 extraction tasks, status shows {len(tasks)}"
for t in tasks:
    assert t["state"] == "done" and t["samples_committed"] == t["samples_total"] > 0, t
ds = json.loads((run / "dataset.json").read_text())
print("dataset.json:", {k: v for k, v in ds.items() if not isinstance(v, (list, dict))})
out = next(run.glob("train/*/export")).parent
steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
losses = [s["loss"] for s in steps if "loss" in s]
total = steps[0]["total_steps"]
assert losses and all(math.isfinite(x) for x in losses), f"training losses {losses}"
assert max(s.get("step", 0) for s in steps if "loss" in s) == total, "training stopped before its last step"
print(f"train: {total} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
cfg = json.loads((out / "export" / "config.json").read_text())
weights = load_file(str(out / "export" / "model.safetensors"))
assert weights and all(w.float().isfinite().all() for w in weights.values()), "non-finite draft weights"
print(f"export: {out / 'export'} ({cfg.get('architectures')}, {len(weights)} tensors)")
EOF

# vLLM in the image put its cache where the entrypoint pointed it (the folder bound from the host).
[[ -n "$(ls -A "${work}/cache/vllm")" ]] || fail "vLLM wrote nothing below VLLM_CACHE_ROOT=/cache/vllm"

stage "apptainer"
if command -v apptainer >/dev/null; then
    sif="${work}/eagle-batch-cpu.sif"
    "${build[@]}" sif "${sif}" --from podman
    apptainer run --containall "${sif}" --help | grep -qw extract || fail "apptainer run ${sif} --help"
    # shellcheck disable=SC2016 # expanded inside the container
    [[ "$(apptainer exec "${sif}" sh -c 'echo "${VLLM_CACHE_ROOT}"')" == */vllm ]] || fail "apptainer exec: cache-env.sh not sourced"
else
    echo "apptainer not found: the .sif step was not run (Debian 12 does not package Apptainer)"
fi

stage ""
printf '%s\n' "${timings[@]}"
printf '%-28s %5d s\n' "total" $((SECONDS - t0))
echo "test-cpu-image.sh: PASSED"
