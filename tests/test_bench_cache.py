"""``scripts/bench_cache.py`` runs end to end on a tiny MLP: its table has the three cells,
each answered correctly (the script checks a hit against the computed answer)."""

from __future__ import annotations

import subprocess
import sys

from tests.server_process import ROOT


def test_the_benchmark_prints_its_table() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench_cache.py", "--repeats", "2", "--requests", "3",
         "--rows", "2", "--width", "8", "--hidden", "16"],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| cell")]
    assert rows == ["hit", "miss", "off"]
    assert "FP32 MLP 8->16->8, 2 rows per request; 2 repeats of 3 requests" in result.stdout
