"""gpu_tests/ runs on the GPU machine, which has pytest and the runtime dependencies but
neither gevent nor pytest-timeout: the shared pytest configuration must not need them."""

from __future__ import annotations

import subprocess
import sys

from tests.server_process import ROOT

# gevent made unimportable (None in sys.modules), pytest-timeout and xdist not loaded.
_BARE = (
    "import sys; sys.modules['gevent'] = None; import pytest; "
    "sys.exit(pytest.main(['-p', 'no:timeout', '-p', 'no:xdist', '-p', 'no:cacheprovider', "
    "'-q', 'gpu_tests']))"
)


def test_gpu_tests_start_without_gevent_or_pytest_timeout() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _BARE], cwd=ROOT, capture_output=True, text=True, check=False,
        timeout=120,
    )
    # 0: passed (a GPU is here); 5 cannot happen (tests are collected); skips count as passes
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error" not in result.stdout.lower(), result.stdout[-3000:]
