"""The committed generated protobuf modules match what scripts/gen_protos.py makes now."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

from tests.server_process import ROOT


def test_generated_modules_are_not_stale(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--out", str(out)],
        cwd=ROOT, check=True, capture_output=True, timeout=120,
    )
    committed = ROOT / "server" / "generated"
    names = sorted(p.name for p in out.iterdir() if p.suffix in (".py", ".pyi"))
    assert names == sorted(p.name for p in committed.iterdir() if p.suffix in (".py", ".pyi"))
    _, mismatch, errors = filecmp.cmpfiles(committed, out, names, shallow=False)
    assert not mismatch and not errors, (
        f"stale generated modules {mismatch + errors}: run python scripts/gen_protos.py"
    )
