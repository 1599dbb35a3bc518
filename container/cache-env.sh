# shellcheck shell=sh
# Point every compile/download cache at one shared folder so that all array tasks (and reruns) reuse
# the kernels and graphs that the first task built. Sourced by the image's entrypoint, by Apptainer's
# %environment (so `apptainer exec` gets it too) and by the rendered slurm/ job scripts.
#
# EAGLE_BATCH_CACHE is the one knob (the same variable eagle_batch.models uses for its model cache).
# Put it on a filesystem every node sees (Lustre/GPFS/NFS scratch), one folder per user: compiled kernels
# and remote-code modules there are imported by every job, so a cache others can write is code they run as
# you (eagle-batch warns about one; docs/explanation/security.md). Each variable below can still be set on
# its own; an existing value wins.
#
# POSIX sh on purpose: Apptainer sources %environment with /bin/sh.
: "${EAGLE_BATCH_CACHE:=${HOME:-/tmp}/.cache/eagle-batch}"
export EAGLE_BATCH_CACHE
# vLLM: torch.compile artifacts (torch_compile_cache/), CUDA-graph-independent, keyed by model+config.
: "${VLLM_CACHE_ROOT:=${EAGLE_BATCH_CACHE}/vllm}"
# Triton kernels (vLLM's fused MoE / MLA kernels on Hopper and Blackwell).
: "${TRITON_CACHE_DIR:=${EAGLE_BATCH_CACHE}/triton}"
# torch inductor's FX graph and autotune caches.
: "${TORCHINDUCTOR_CACHE_DIR:=${EAGLE_BATCH_CACHE}/inductor}"
# FlashInfer JIT-compiled attention/sampling kernels (built with nvcc on first use per arch).
: "${FLASHINFER_WORKSPACE_BASE:=${EAGLE_BATCH_CACHE}/flashinfer}"
# torch C++/CUDA extensions built at run time, and apache-tvm-ffi's JIT modules (FlashInfer 0.7 kernels).
: "${TORCH_EXTENSIONS_DIR:=${EAGLE_BATCH_CACHE}/torch_extensions}"
: "${TVM_FFI_CACHE_DIR:=${EAGLE_BATCH_CACHE}/tvm-ffi}"
# CUDA driver PTX->SASS JIT cache; the default 256 MiB is too small for vLLM's kernels.
: "${CUDA_CACHE_PATH:=${EAGLE_BATCH_CACHE}/cuda}"
: "${CUDA_CACHE_MAXSIZE:=4294967296}"
# Hugging Face: remote code modules (trust_remote_code) are copied under HF_HOME/modules.
: "${HF_HOME:=${EAGLE_BATCH_CACHE}/hf}"
# Everything else that follows XDG (e.g. libraries without their own variable).
: "${XDG_CACHE_HOME:=${EAGLE_BATCH_CACHE}/xdg}"
export VLLM_CACHE_ROOT TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR FLASHINFER_WORKSPACE_BASE \
    TORCH_EXTENSIONS_DIR TVM_FFI_CACHE_DIR CUDA_CACHE_PATH CUDA_CACHE_MAXSIZE HF_HOME XDG_CACHE_HOME
# Jobs read local model folders only (model.path); never reach for the hub from a compute node.
: "${HF_HUB_OFFLINE:=1}"
export HF_HUB_OFFLINE
