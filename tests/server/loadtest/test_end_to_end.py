"""``tensorgate-bench`` against a real server on the example repository: a short sweep over
HTTP on ``simple`` and over gRPC on ``mlp`` writes its CSV and PNG, with the client's counts
matching the server's statistics; refusals end with one line and exit status 1 or 2."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_process import EXAMPLES, ROOT, ServerProcess, start_server

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def example_server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES)
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it (``python -m server.loadtest`` is ``tensorgate-bench``)."""
    return subprocess.run(
        [sys.executable, "-m", "server.loadtest", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _sweep(url: str, tmp_path: Path, *args: str) -> tuple[str, list[dict[str, str]], bytes]:
    csv_path, png_path = tmp_path / "out.csv", tmp_path / "out.png"
    result = _bench(
        "-u",
        url,
        "--concurrency-range",
        "1:2",
        "--measurement-seconds",
        "1",
        "--warmup-seconds",
        "0.2",
        "--workers",
        "1",
        "--no-progress",
        "--csv",
        str(csv_path),
        "--plot",
        str(png_path),
        *args,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    with csv_path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return result.stdout, rows, png_path.read_bytes()


def _assert_measured(rows: list[dict[str, str]], batch: int) -> None:
    assert [row["concurrency"] for row in rows] == ["1", "2"]
    for row in rows:
        assert row["errors"] == "0" and row["workers"] == "1"
        assert int(row["requests"]) > 0 and float(row["throughput_infer_per_s"]) > 0
        assert float(row["throughput_rows_per_s"]) == pytest.approx(
            batch * float(row["throughput_infer_per_s"]), rel=1e-3
        )
        assert 0 < float(row["latency_p50_ms"]) <= float(row["latency_p99_ms"])
        # Lock-step phases: the server counted exactly the requests this client measured.
        assert row["server_requests"] == row["requests"] and row["server_failures"] == "0"
        assert float(row["server_compute_infer_us"]) > 0
        for column in ("server_queue_us", "server_compute_input_us", "server_compute_output_us"):
            assert float(row[column]) >= 0
        assert float(row["server_avg_batch_size"]) >= batch
        assert 0 < float(row["client_cpu_percent_max"]) < 100


def _assert_png(data: bytes) -> None:
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert int.from_bytes(data[16:20], "big") > 500  # width of the two-panel figure


def test_http_sweep_on_simple(example_server: ServerProcess, tmp_path: Path) -> None:
    stdout, rows, png = _sweep(example_server.url, tmp_path, "-m", "simple")
    _assert_measured(rows, batch=1)
    _assert_png(png)
    assert "simple (version server's choice) over HTTP binary" in stdout
    assert "queue µs" in stdout and "client CPU %" in stdout


def test_grpc_sweep_on_mlp(example_server: ServerProcess, tmp_path: Path) -> None:
    stdout, rows, png = _sweep(
        example_server.grpc_url, tmp_path, "-m", "mlp", "-i", "grpc", "-b", "2"
    )
    _assert_measured(rows, batch=2)
    _assert_png(png)
    assert "INPUT0 FP32 [2, 256]" in stdout and "rows/s" in stdout


def test_refusals_are_one_line(example_server: ServerProcess) -> None:
    unknown = _bench("-u", example_server.url, "-m", "nope", "--no-progress")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == (
        "tensorgate-bench: model 'nope': the server answered 400: "
        "Request for unknown model: 'nope' is not found"
    )
    variable = _bench("-u", example_server.grpc_url, "-i", "grpc", "-m", "identity_fp32")
    assert variable.returncode == 2 and "Traceback" not in variable.stderr
    assert "--shape INPUT0:16" in variable.stderr.splitlines()[-1]
