"""``scripts/bench_thread_hop.py`` runs end to end: both hand-overs, their table and figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server_process import ROOT


def test_the_benchmark_prints_both_hand_overs(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "scripts/bench_thread_hop.py", "--calls", "50", "--repeat", "2",
         "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| hand-over")]
    assert rows == ["WorkerThread", "ThreadPoolExecutor(1) + run_in_executor + shield"]
    assert "50 in a row" in result.stdout and "× WorkerThread's CPU" in result.stdout
    written = json.loads(figures.read_text())
    for cell in written.values():
        assert len(cell["cpu"]) == 2 and len(cell["wall"]) == 2
        assert all(value > 0 for value in cell["wall"])
