#!/usr/bin/env bash
# Build the eagle-batch image with Docker or Apptainer, convert it to .sif, push it, or re-lock the
# Python requirements. Every version comes from container/versions.env (the only place they are set).
#
#   container/build.sh docker   [--push REGISTRY/REPO] [extra docker build args...]
#   container/build.sh apptainer [OUT.sif]          # builds from container/eagle-batch.def
#   container/build.sh sif [OUT.sif]                # docker image in the local daemon -> .sif
#   container/build.sh enroot [OUT.sqsh]            # docker image in the local daemon -> enroot squashfs (pyxis)
#   container/build.sh lock                         # regenerate requirements.lock (needs `uv`)
#   container/build.sh print                        # show the versions and the image reference
#
# Run it from anywhere; the build context is the repository root (pyproject.toml + eagle_batch/).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/.." && pwd)"
versions_file="${here}/versions.env"

# versions.env is KEY=value lines, not a shell script (values may contain ';'), so read it as data.
declare -A V=()
build_args=()
while IFS= read -r line || [[ -n "${line}" ]]; do
    [[ -z "${line}" || "${line}" == \#* ]] && continue
    key="${line%%=*}"
    value="${line#*=}"
    if [[ ! "${key}" =~ ^[A-Z_][A-Z0-9_]*$ ]]; then
        echo "build.sh: ${versions_file}: bad line '${line}' (want KEY=value)" >&2
        exit 2
    fi
    V["${key}"]="${value}"
    build_args+=("--build-arg" "${key}=${value}")
done <"${versions_file}"

image="${V[IMAGE_NAME]}:${V[IMAGE_TAG]}"
cmd="${1:-help}"
shift || true

case "${cmd}" in
    print)
        for key in "${!V[@]}"; do printf '%s=%s\n' "${key}" "${V[${key}]}"; done | sort
        echo "image=${image}"
        ;;
    docker)
        push=""
        if [[ "${1:-}" == "--push" ]]; then
            push="${2:?--push needs REGISTRY/REPO, e.g. ghcr.io/acme/eagle-batch}"
            shift 2
        fi
        # BuildKit reads container/Dockerfile.dockerignore for this Dockerfile (context = repo root).
        DOCKER_BUILDKIT=1 docker build "${build_args[@]}" -f "${here}/Dockerfile" -t "${image}" "$@" "${repo}"
        if [[ -n "${push}" ]]; then
            docker tag "${image}" "${push}:${V[IMAGE_TAG]}"
            docker push "${push}:${V[IMAGE_TAG]}"
        fi
        echo "built ${image}"
        ;;
    apptainer)
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sif}"
        # %files in the .def copies paths relative to the current directory: build from the repo root.
        # Unprivileged builds need --fakeroot (user namespaces); root builds do not.
        flags=()
        if [[ "$(id -u)" != 0 ]]; then flags+=(--fakeroot); fi
        (cd "${repo}" && apptainer build "${flags[@]}" "${build_args[@]}" "${out}" "${here}/eagle-batch.def")
        echo "built ${out}"
        ;;
    sif)
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sif}"
        apptainer build "${out}" "docker-daemon://${image}"
        echo "built ${out}"
        ;;
    enroot)
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sqsh}"
        enroot import -o "${out}" "dockerd://${image}"
        echo "built ${out} (use it with srun --container-image=${out})"
        ;;
    lock)
        # Resolve for the image's platform, not this machine's: Python 3.12 on Ubuntu 24.04 (glibc
        # 2.39). uv reads wheel metadata with HTTP range requests, so no CUDA wheel is downloaded.
        uv pip compile "${here}/requirements.in" \
            --python-version "${V[PYTHON_VERSION]}" --python-platform x86_64-manylinux_2_39 \
            --no-build --index-url https://pypi.org/simple \
            --custom-compile-command "container/build.sh lock" \
            -o "${here}/requirements.lock"
        ;;
    help | -h | --help)
        sed -n '2,12p' "${BASH_SOURCE[0]}"
        ;;
    *)
        echo "build.sh: unknown command '${cmd}' (docker | apptainer | sif | enroot | lock | print)" >&2
        exit 2
        ;;
esac
