#!/usr/bin/env bash
# Build the eagle-batch image with Docker, podman or Apptainer, convert it to .sif, push it, or re-lock
# the Python requirements. Every version comes from the flavour's file (the only place they are set):
# gpu (default) = container/versions.env, cpu = container/versions-cpu.env.
#
#   container/build.sh [--flavour gpu|cpu] COMMAND ...
#   docker   [--push REGISTRY/REPO] [docker build args...]
#   podman   [podman build args...]          # e.g. --isolation chroot --network host
#   base                                     # cpu: debootstrap Debian minbase -> BASE_IMAGE (podman)
#   wheels   [DIR]                           # the lock's pins no index serves, fetched with this pip
#   apptainer [OUT.sif]                      # gpu: builds from container/eagle-batch.def
#   sif      [OUT.sif] [--from docker|podman]  # image in the local docker daemon / podman -> .sif
#   enroot   [OUT.sqsh]                      # image in the local docker daemon -> enroot squashfs
#   lock     [uv pip compile args...]        # regenerate the flavour's lock, with hashes (needs `uv`)
#   pin-base                                 # gpu: resolve BASE_IMAGE's digest into the versions file
#   print                                    # show the versions and the image reference
#
# Run it from anywhere; the build context is the repository root (pyproject.toml + eagle_batch/).
# The `wheels` build context (docker, podman) is WHEELS_DIR, default
# ${XDG_CACHE_HOME:-~/.cache}/eagle-batch/wheels-FLAVOUR, filled by `wheels` before each build.
# BUILD_CA_BUNDLE=FILE (docker, podman): CA certificates pip trusts during the build, for a network
# that re-signs TLS; passed as a build secret, so it does not end up in the image.
#
# Supply chain: a build (docker, podman, apptainer) takes a registry base image by digest only
# (BASE_IMAGE@BASE_IMAGE_DIGEST; `pin-base` resolves the digest of BASE_IMAGE's tag once, with
# `docker buildx imagetools inspect` or `skopeo inspect`, and writes it into the versions file: review and
# commit that line), installs the lock with `pip install --require-hashes` (`lock` writes the hashes), and
# downloads over https only. A build missing either refuses, saying which command to run.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/.." && pwd)"

flavour=gpu
case "${1:-}" in
    --flavour) flavour="${2:?--flavour needs gpu or cpu}"; shift 2 ;;
    --flavour=*) flavour="${1#--flavour=}"; shift ;;
esac
case "${flavour}" in
    gpu) versions_file="${here}/versions.env" ;;
    cpu) versions_file="${here}/versions-cpu.env" ;;
    *) echo "build.sh: unknown flavour '${flavour}' (gpu | cpu)" >&2; exit 2 ;;
esac

# The versions file is KEY=value lines, not a shell script (values may contain ';'), so read it as data.
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
    [[ "${key}" == BASE_IMAGE || "${key}" == BASE_IMAGE_DIGEST ]] && continue
    build_args+=("--build-arg" "${key}=${value}")
done <"${versions_file}"
# A registry base by digest (the tag names it for people; the digest is what is pulled); a local one as is.
base_ref="${V[BASE_IMAGE]}"
[[ -n "${V[BASE_IMAGE_DIGEST]:-}" ]] && base_ref="${V[BASE_IMAGE]}@${V[BASE_IMAGE_DIGEST]}"
build_args+=("--build-arg" "BASE_IMAGE=${base_ref}")

require_pinned() {
    if [[ "${V[BASE_IMAGE]}" != localhost/* && -z "${V[BASE_IMAGE_DIGEST]:-}" ]]; then
        echo "build.sh: BASE_IMAGE=${V[BASE_IMAGE]} is pinned by tag only; run \`container/build.sh --flavour ${flavour} pin-base\` (it writes BASE_IMAGE_DIGEST into ${versions_file}), review and commit it, then build" >&2
        exit 2
    fi
    if ! grep -q -- '--hash=sha256:' "${lock}"; then
        echo "build.sh: ${lock} has no hashes, and the image installs it with pip --require-hashes; re-lock with \`container/build.sh --flavour ${flavour} lock\`, review and commit it, then build" >&2
        exit 2
    fi
}
image="${V[IMAGE_NAME]}:${V[IMAGE_TAG]}"
secrets=()
if [[ -n "${BUILD_CA_BUNDLE:-}" ]]; then
    [[ -s "${BUILD_CA_BUNDLE}" ]] || { echo "build.sh: BUILD_CA_BUNDLE=${BUILD_CA_BUNDLE} is not a non-empty file" >&2; exit 2; }
    secrets=(--secret "id=ca-bundle,src=${BUILD_CA_BUNDLE}")
fi
lock="${repo}/${V[REQUIREMENTS_LOCK]}"
wheels_dir="${WHEELS_DIR:-${XDG_CACHE_HOME:-${HOME}/.cache}/eagle-batch/wheels-${flavour}}"
cmd="${1:-help}"
shift || true

# The lock's pins that carry a local version label (torch==2.13.0+cpu): no index the image build
# reaches serves them, so they come from this machine's pip, with its configuration (find-links,
# extra index), into a folder the build mounts as the `wheels` context. Empty for a lock without any.
fetch_wheels() {
    local dir="$1" pins
    mkdir -p "${dir}"
    pins="$(sed -n 's/^\([A-Za-z0-9_.-]*==[^ ;]*+[^ ;]*\).*/\1/p' "${lock}")"
    [[ -z "${pins}" ]] && return 0
    # shellcheck disable=SC2086 # one argument per pin
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version "${V[PYTHON_VERSION]}" -d "${dir}" ${pins} \
        || { echo "build.sh: pip could not fetch ${pins//$'\n'/ } (configure a find-links folder or index that has it)" >&2; exit 1; }
}

case "${cmd}" in
    print)
        for key in "${!V[@]}"; do printf '%s=%s\n' "${key}" "${V[${key}]}"; done | sort
        echo "image=${image}"
        ;;
    wheels)
        fetch_wheels "${1:-${wheels_dir}}"
        ls -1 "${1:-${wheels_dir}}"
        ;;
    docker)
        require_pinned
        push=""
        if [[ "${1:-}" == "--push" ]]; then
            push="${2:?--push needs REGISTRY/REPO, e.g. ghcr.io/acme/eagle-batch}"
            shift 2
        fi
        fetch_wheels "${wheels_dir}"
        # BuildKit reads container/Dockerfile.dockerignore for this Dockerfile (context = repo root).
        DOCKER_BUILDKIT=1 docker build "${build_args[@]}" "${secrets[@]}" --build-context "wheels=${wheels_dir}" \
            -f "${here}/Dockerfile" -t "${image}" "$@" "${repo}"
        if [[ -n "${push}" ]]; then
            docker tag "${image}" "${push}:${V[IMAGE_TAG]}"
            docker push "${push}:${V[IMAGE_TAG]}"
        fi
        echo "built ${image}"
        ;;
    podman)
        require_pinned
        fetch_wheels "${wheels_dir}"
        # --format docker: the OCI format has no SHELL, so podman would run the RUN steps with /bin/sh
        # instead of the Dockerfile's bash -o pipefail.
        podman build --format docker "${build_args[@]}" "${secrets[@]}" --build-context "wheels=${wheels_dir}" \
            --ignorefile "${here}/Dockerfile.dockerignore" -f "${here}/Dockerfile" -t "${image}" "$@" "${repo}"
        echo "built localhost/${image}"
        ;;
    base)
        # Only a local base can be made here; a registry base (the gpu flavour's) is pulled by the build.
        base="${V[BASE_IMAGE]}"
        if [[ "${base}" != localhost/*:* ]]; then
            echo "build.sh: BASE_IMAGE=${base} comes from a registry; 'base' makes only localhost/NAME:SUITE images (--flavour cpu)" >&2
            exit 2
        fi
        if podman image exists "${base}"; then
            echo "${base} exists (podman rmi ${base} to make it again)"
            exit 0
        fi
        command -v debootstrap >/dev/null || { echo "build.sh: debootstrap not found (apt-get install debootstrap)" >&2; exit 1; }
        rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/eagle-batch-rootfs.XXXXXX")"
        trap 'rm -rf "${rootfs}"' EXIT
        # The tag is the Debian suite; minbase = the essential and required packages only (apt, no
        # systemd); the Dockerfile installs what the image needs.
        debootstrap --variant=minbase "${base##*:}" "${rootfs}" "${DEBIAN_MIRROR:-https://deb.debian.org/debian}" >/dev/null
        tar -C "${rootfs}" -c . | podman import --quiet - "${base}" >/dev/null
        echo "imported ${base}"
        ;;
    apptainer)
        if [[ "${V[BASE_IMAGE]}" == localhost/* ]]; then
            echo "build.sh: Apptainer cannot bootstrap from the local base ${V[BASE_IMAGE]}; build the image with podman, then: build.sh --flavour ${flavour} sif OUT.sif --from podman" >&2
            exit 2
        fi
        require_pinned
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sif}"
        fetch_wheels "${wheels_dir}"
        # %files in the .def copies paths relative to the current directory: build from the repo root.
        # Unprivileged builds need --fakeroot (user namespaces); root builds do not.
        flags=()
        if [[ "$(id -u)" != 0 ]]; then flags+=(--fakeroot); fi
        (cd "${repo}" && apptainer build "${flags[@]}" "${build_args[@]}" --build-arg "WHEELS_DIR=${wheels_dir}" "${out}" "${here}/eagle-batch.def")
        echo "built ${out}"
        ;;
    sif)
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sif}"
        from="docker"
        if [[ "${2:-}" == "--from" ]]; then from="${3:?--from needs docker or podman}"; fi
        case "${from}" in
            docker) apptainer build "${out}" "docker-daemon://${image}" ;;
            podman)
                # Apptainer cannot read podman's storage: go through an OCI archive.
                archive="$(mktemp "${TMPDIR:-/var/tmp}/eagle-batch-oci.XXXXXX.tar")"
                trap 'rm -f "${archive}"' EXIT
                rm -f "${archive}"
                podman save --format oci-archive -o "${archive}" "localhost/${image}"
                apptainer build "${out}" "oci-archive://${archive}"
                ;;
            *) echo "build.sh: sif --from '${from}': want docker or podman" >&2; exit 2 ;;
        esac
        echo "built ${out}"
        ;;
    enroot)
        out="${1:-${repo}/${V[IMAGE_NAME]}-${V[IMAGE_TAG]}.sqsh}"
        enroot import -o "${out}" "dockerd://${image}"
        echo "built ${out} (use it with srun --container-image=${out})"
        ;;
    lock)
        # Resolve for the image's platform, not this machine's (versions file: PYTHON_VERSION, the
        # base's glibc in LOCK_PLATFORM). uv reads wheel metadata with HTTP range requests, so no CUDA
        # wheel is downloaded. The .in file's `# lock-exclude:` names stay out of the lock, and its
        # `# pip-check-expected:` lines are copied into it for container/pip-check.sh.
        src="${lock%.lock}.in"
        exclude=()
        read -r -a names <<<"$(sed -n 's/^# lock-exclude: //p' "${src}" | tr '\n' ' ')"
        for name in "${names[@]}"; do exclude+=(--no-emit-package "${name}"); done
        compile_cmd="container/build.sh lock"
        [[ "${flavour}" != gpu ]] && compile_cmd="container/build.sh --flavour ${flavour} lock"
        uv pip compile "${src}" --no-config --generate-hashes \
            --python-version "${V[PYTHON_VERSION]}" --python-platform "${V[LOCK_PLATFORM]}" \
            --no-build --index-url https://pypi.org/simple "${exclude[@]}" \
            --custom-compile-command "${compile_cmd}" "$@" -o "${lock}"
        sed -n '/^# pip-check-expected: /p' "${src}" >>"${lock}"
        ;;
    pin-base)
        base="${V[BASE_IMAGE]}"
        [[ "${base}" == localhost/* ]] && { echo "build.sh: ${base} is a local image: nothing to pin" >&2; exit 2; }
        if command -v docker >/dev/null && digest="$(docker buildx imagetools inspect "${base}" --format '{{json .Manifest.Digest}}' 2>/dev/null)"; then
            digest="${digest//\"/}"
        elif command -v skopeo >/dev/null; then
            digest="$(skopeo inspect --format '{{.Digest}}' "docker://${base}")"
        else
            echo "build.sh: pin-base needs docker (buildx) or skopeo to ask the registry for ${base}'s digest" >&2
            exit 1
        fi
        [[ "${digest}" =~ ^sha256:[0-9a-f]{64}$ ]] || { echo "build.sh: ${base}: not a digest: '${digest}'" >&2; exit 1; }
        sed -i "s/^BASE_IMAGE_DIGEST=.*/BASE_IMAGE_DIGEST=${digest}/" "${versions_file}"
        echo "BASE_IMAGE_DIGEST=${digest} written into ${versions_file} (${base})"
        ;;
    help | -h | --help)
        sed -n '2,28p' "${BASH_SOURCE[0]}"
        ;;
    *)
        echo "build.sh: unknown command '${cmd}' (docker | podman | base | wheels | apptainer | sif | enroot | lock | pin-base | print)" >&2
        exit 2
        ;;
esac
