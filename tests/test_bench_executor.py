"""``scripts/bench_executor.py`` runs end to end: its three cells (two with the driver in a
process of its own), both servers and the wake alone, on the servers' event loop, each answer it
checks being the example model's (the script exits non-zero on a wrong one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from server import event_loop
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
    assert rows == ["pipelined", "driver apart", "after idle"]
    assert "after idle: the driver apart, one request at a time, 50 µs after each answer" in (
        result.stdout
    )
    # (not bench_executor.loop_name(): importing the script pins this process's threads)
    loop = "asyncio's own loop" if event_loop.loop_factory() is None else "uvloop's loop"
    assert f"30 requests per run, on {loop}, under " in result.stdout
    assert "wake alone (blocked on a socket, woken by one byte every 50 µs" in result.stdout
    written = json.loads(figures.read_text())
    assert len(written["wake_alone"]) == 2 and all(value > 0 for value in written["wake_alone"])
    recorded = written["figures"]
    for cell in ("pipelined", "driver apart", "after idle"):
        for server in ("executor", "floor"):
            assert len(recorded[cell][server]) == 2
            assert all(value > 0 for value in recorded[cell][server])
