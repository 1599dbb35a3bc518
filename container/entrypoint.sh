#!/bin/sh
# Image entrypoint: set up the shared caches, then run `eagle-batch ARGS...`. Any other program can
# be run with `docker run --entrypoint bash IMAGE` or `apptainer exec IMAGE CMD`.
set -eu
# shellcheck source-path=SCRIPTDIR source=cache-env.sh
. /opt/eagle-batch/cache-env.sh
# Create the cache folders now: a missing parent makes some libraries fall back to $HOME silently.
mkdir -p "${VLLM_CACHE_ROOT}" "${TRITON_CACHE_DIR}" "${TORCHINDUCTOR_CACHE_DIR}" \
    "${FLASHINFER_WORKSPACE_BASE}" "${TORCH_EXTENSIONS_DIR}" "${TVM_FFI_CACHE_DIR}" "${CUDA_CACHE_PATH}" "${HF_HOME}" "${XDG_CACHE_HOME}" 2>/dev/null || \
    echo "eagle-batch entrypoint: cannot create caches under ${EAGLE_BATCH_CACHE}; mount a writable folder there" >&2
exec eagle-batch "$@"
