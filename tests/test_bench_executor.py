"""``scripts/bench_executor.py`` runs end to end: its three cells (one with its driver in a
process of its own), both servers and the sleep alone, each answer it checks being the example
model's (the script exits non-zero on a wrong one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server_process import ROOT


def test_the_benchmark_prints_its_table(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_executor.py", "--repeat", "2", "--requests", "30",
         "--depth", "4", "--gap-us", "50", "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| cell")]
    assert rows == ["pipelined", "after idle", "driver apart"]
    assert "one request at a time, 50 µs after each answer; driver apart: 4 in flight" in (
        result.stdout
    )
    assert "sleep alone (a 50 µs wait on the loop's timer, no request): " in result.stdout
    written = json.loads(figures.read_text())
    assert len(written["sleep_alone"]) == 2 and all(value > 0 for value in written["sleep_alone"])
    recorded = written["figures"]
    for cell in ("pipelined", "after idle", "driver apart"):
        for server in ("executor", "floor"):
            assert len(recorded[cell][server]) == 2
            assert all(value > 0 for value in recorded[cell][server])
