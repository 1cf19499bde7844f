"""ruff and mypy --strict stay clean (both come with the test extra)."""

from __future__ import annotations

import subprocess
import sys

from tests.server_process import ROOT


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False,
        timeout=300,
    )


def test_ruff_is_clean() -> None:
    result = _run(
        "ruff", "check", "server", "backends", "scripts", "tests", "gpu_tests",
        "triton_python_backend_utils.py",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = _run(
        "mypy", "server", "backends", "scripts", "tests", "gpu_tests",
        "triton_python_backend_utils.py",
    )
    assert result.returncode == 0, result.stdout + result.stderr
