"""Smoke test: NVIDIA's real perf_analyzer (the C++ client) measures the server over gRPC and HTTP.

The binary is not a Python package: ``scripts/install_perf_analyzer.sh`` installs it (Linux x86_64,
root or sudo for Debian's libb64-0d) at ``.perf_analyzer/bin/perf_analyzer``; ``$PERF_ANALYZER``
points elsewhere. Without it the module is skipped.

perf_analyzer reads the model metadata and configuration, ``GET /v2`` (server metadata; it skips
server-side statistics unless ``statistics`` is listed in ``extensions``) and then sends inference
requests with random input data, one connection per concurrency slot. The measurement is bounded:
one-second windows, exactly three per concurrency level, stability only loosely required (this is a
compatibility check, not a benchmark). Covered: HTTP and gRPC; a batched model with ``-b`` > 1 and
a dynamically batched one; a model without batching; a BYTES model (perf_analyzer's random
strings); sequence models (Direct and Oldest, over HTTP, gRPC and a gRPC stream);
``--collect-metrics`` against the metrics endpoint; ``--shared-memory system``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import make_models
from tests.sequence_models import build_sequence_repository
from tests.server_process import EXAMPLES, ROOT, ServerProcess, start_server

PERF_ANALYZER = Path(
    os.environ.get("PERF_ANALYZER") or ROOT / ".perf_analyzer" / "bin" / "perf_analyzer"
)

pytestmark = pytest.mark.skipif(
    not (PERF_ANALYZER.is_file() and os.access(PERF_ANALYZER, os.X_OK)),
    reason=f"perf_analyzer is not installed at {PERF_ANALYZER} "
    "(run scripts/install_perf_analyzer.sh, or set PERF_ANALYZER=/path/to/perf_analyzer)",
)

_THROUGHPUT = re.compile(r"Throughput: ([0-9.]+) infer/sec")
# Each concurrency level: 3 windows of 1 s (max-trials 3, so never more); 2 levels, plus start-up.
_MEASUREMENT = (
    "--concurrency-range=1:2",
    "--measurement-interval=1000",
    "--max-trials=3",
    "--stability-percentage=1000",
)
_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    extra = tmp_path_factory.mktemp("perf_analyzer_repo")
    # No batching: a fixed first dim, so the config is completed with max_batch_size 0.
    make_models.save(make_models.identity("FP32", [16]), extra / "unbatched" / "1" / "model.onnx")
    build_sequence_repository(extra)  # sequence models (Direct, Oldest, a string CORRID)
    process = start_server(EXAMPLES, extra, args=("--allow-client-shm=true",))
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


def _perf_analyzer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PERF_ANALYZER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_perf_analyzer_measures_simple(server: ServerProcess, protocol: str) -> None:
    port = server.grpc_port if protocol == "grpc" else server.port
    result = _perf_analyzer(
        "-m", "simple", "-u", f"127.0.0.1:{port}", "-i", protocol, *_MEASUREMENT
    )
    report = (
        f"perf_analyzer exited {result.returncode}:\n{result.stdout}\n"
        f"--- server log ---\n{server.log}"
    )
    assert result.returncode == 0, report
    throughputs = [float(value) for value in _THROUGHPUT.findall(result.stdout)]
    # One "Throughput:" line per concurrency level (the summary lines are lower-case).
    assert len(throughputs) == 2, report
    assert all(value > 0 for value in throughputs), report
    assert "infer/sec" in result.stdout, report
    assert server.proc.poll() is None, report


@pytest.mark.parametrize(
    ("model", "protocol", "extra"),
    [
        ("simple", "http", ("-b", "4")),
        ("mlp", "grpc", ("-b", "2")),
        ("unbatched", "grpc", ()),
        ("identity_bytes", "grpc", ("--shape", "INPUT0:4")),
        ("identity_bytes", "http", ("--shape", "INPUT0:4")),
        # perf_analyzer sends sequences (ids, START, END) to a model with sequence_batching
        ("simple_sequence", "http", ("--sequence-length=5",)),
        ("simple_dyna_sequence", "grpc", ("--sequence-length=5", "--streaming")),
        ("simple_string_dyna_sequence", "grpc", ("--sequence-length=3",)),
    ],
)
def test_perf_analyzer_model_kinds(
    server: ServerProcess, model: str, protocol: str, extra: tuple[str, ...]
) -> None:
    port = server.grpc_port if protocol == "grpc" else server.port
    result = _perf_analyzer(
        "-m", model, "-u", f"127.0.0.1:{port}", "-i", protocol, *extra,
        "--concurrency-range=1:1", *_MEASUREMENT[1:],
    )
    report = f"perf_analyzer exited {result.returncode}:\n{result.stdout}\n--- server log ---\n{server.log}"
    assert result.returncode == 0, report
    (throughput,) = [float(value) for value in _THROUGHPUT.findall(result.stdout)]
    assert throughput > 0, report
    batch = int(extra[1]) if extra[:1] == ("-b",) else 1
    assert f"Batch size: {batch}" in result.stdout, report
    # The server-side breakdown comes from the statistics extension.
    assert "Successful request count:" in result.stdout, report
    assert server.proc.poll() is None, report


def test_perf_analyzer_collects_metrics(server: ServerProcess) -> None:
    """``--collect-metrics`` scrapes /metrics; on a machine without GPUs perf_analyzer, as with
    Triton, only warns that the GPU gauges are absent."""
    assert server.metrics_port is not None
    result = _perf_analyzer(
        "-m", "simple", "-u", f"127.0.0.1:{server.port}", "-i", "http",
        "--collect-metrics", f"--metrics-url=http://127.0.0.1:{server.metrics_port}/metrics",
        "--metrics-interval=500", "--concurrency-range=1:1", *_MEASUREMENT[1:],
    )
    report = f"perf_analyzer exited {result.returncode}:\n{result.stdout}"
    assert result.returncode == 0, report
    assert "Server Prometheus Metrics:" in result.stdout, report
    assert len(_THROUGHPUT.findall(result.stdout)) == 1, report


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_with_system_shared_memory(server: ServerProcess, protocol: str) -> None:
    """perf_analyzer unregisters every region of both kinds, registers its own, and sends
    every input and output through them."""
    port = server.grpc_port if protocol == "grpc" else server.port
    result = _perf_analyzer(
        "-m", "simple", "-u", f"127.0.0.1:{port}", "-i", protocol,
        "--shared-memory=system", "--output-shared-memory-size=256",
        "--concurrency-range=1:1", *_MEASUREMENT[1:],
    )
    report = f"perf_analyzer exited {result.returncode}:\n{result.stdout}\n{server.log}"
    assert result.returncode == 0, report
    (throughput,) = [float(value) for value in _THROUGHPUT.findall(result.stdout)]
    assert throughput > 0, report
    assert "Successful request count:" in result.stdout, report
