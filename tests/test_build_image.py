"""scripts/build_image.sh, without building anything: it runs with a PATH that holds only stub
``docker`` and ``buildah`` scripts, which record how they were called (a real build takes
minutes, ~7 GB and registry access; it is not run here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.server_process import ROOT

SCRIPT = ROOT / "scripts" / "build_image.sh"
DOCKERFILE = ROOT / "Dockerfile.cuda"
BASH = "/bin/bash"


def _stub(folder: Path, name: str, info_status: int = 0) -> None:
    """A builder that logs its arguments (one a line) and DOCKER_BUILDKIT; ``docker info``
    exits with ``info_status``. Bash builtins only: the PATH has nothing else."""
    path = folder / name
    path.write_text(
        f"#!{BASH}\n"
        f'if [[ "$1" == info ]]; then exit {info_status}; fi\n'
        f'{{ echo "{name}"; echo "DOCKER_BUILDKIT=${{DOCKER_BUILDKIT:-}}"; '
        'printf "%s\\n" "$@"; } > "$BUILD_LOG"\n'
    )
    path.chmod(0o755)


def _run(tmp_path: Path, stubs: dict[str, int], *args: str,
         **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the script with only ``stubs`` (name -> exit status of ``docker info``) on PATH;
    return the result and the logged call (the builder's name, DOCKER_BUILDKIT, its args)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, info_status in stubs.items():
        _stub(bin_dir, name, info_status)
    log = tmp_path / "build.log"
    log.unlink(missing_ok=True)
    result = subprocess.run(
        [BASH, str(SCRIPT), *args], capture_output=True, text=True, timeout=30, check=False,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path), "BUILD_LOG": str(log), **env},
    )
    return result, log.read_text().splitlines() if log.exists() else []


def test_the_script_parses() -> None:
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True, timeout=30)
    assert os.access(SCRIPT, os.X_OK)


def test_buildah_when_there_is_no_docker(tmp_path: Path) -> None:
    result, call = _run(tmp_path, {"buildah": 0})
    assert result.returncode == 0, result.stderr
    assert call == [
        "buildah", "DOCKER_BUILDKIT=",
        "--storage-driver", "vfs", "build", "--isolation", "chroot", "--format", "docker",
        "--file", str(DOCKERFILE), "--tag", "tensorgate:cuda12", "--build-arg", "CUDA=12",
        str(ROOT),
    ]
    assert result.stdout == "tensorgate:cuda12\n"


def test_buildah_when_the_docker_daemon_does_not_answer(tmp_path: Path) -> None:
    result, call = _run(tmp_path, {"docker": 1, "buildah": 0})
    assert result.returncode == 0, result.stderr
    assert call[0] == "buildah"
    assert "daemon does not answer" in result.stderr


def test_docker_with_buildkit_when_its_daemon_answers(tmp_path: Path) -> None:
    result, call = _run(tmp_path, {"docker": 0, "buildah": 0}, "registry.example.com/tg:13",
                        "--cuda", "13", "--", "--pull", "--no-cache")
    assert result.returncode == 0, result.stderr
    assert call == [
        "docker", "DOCKER_BUILDKIT=1", "build",
        "--file", str(DOCKERFILE), "--tag", "registry.example.com/tg:13",
        "--build-arg", "CUDA=13", "--pull", "--no-cache", str(ROOT),
    ]


def test_tag_follows_cuda_and_builder_can_be_chosen(tmp_path: Path) -> None:
    result, call = _run(tmp_path, {"docker": 0, "buildah": 0}, CUDA="13", BUILDER="buildah")
    assert result.returncode == 0, result.stderr
    assert call[0] == "buildah"
    assert call[call.index("--tag") + 1] == "tensorgate:cuda13"
    assert call[call.index("--build-arg") + 1] == "CUDA=13"


@pytest.mark.parametrize(
    ("stubs", "args", "message"),
    [
        ({}, (), "neither docker nor buildah is installed"),
        ({"docker": 1}, (), "daemon does not answer"),
        ({"buildah": 0}, ("--cuda", "11"), "--cuda must be 12 or 13"),
        ({"buildah": 0}, ("a:1", "b:2"), "one tag only"),
        ({"buildah": 0}, ("--no-cache",), "builder options go after --"),
    ],
)
def test_refusals(tmp_path: Path, stubs: dict[str, int], args: tuple[str, ...],
                  message: str) -> None:
    result, call = _run(tmp_path, stubs, *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert call == []
