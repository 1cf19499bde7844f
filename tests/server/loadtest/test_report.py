"""The CSV's columns and values, the terminal table, the client-bound warnings and the PNG."""

from __future__ import annotations

import csv
from pathlib import Path

from server.loadtest.measurements import (
    Duration,
    Sample,
    ServerBreakdown,
    ServerCounters,
    StepResult,
)
from server.loadtest.report import CSV_COLUMNS, table, warnings, write_csv, write_plot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _result(concurrency: int, busy: float, batch: int = 1, stats: bool = True) -> StepResult:
    sample = Sample(
        requests=1000 * concurrency,
        errors=concurrency - 1,
        elapsed=2.0,
        client_cpu=busy * 2.0,
        latencies=[0.001 * concurrency] * 900 + [0.01 * concurrency] * 100,
    )
    server = None
    if stats:
        server = ServerBreakdown.of(
            ServerCounters(
                inference_count=2000 * concurrency * batch,
                execution_count=1000 * concurrency,
                success=Duration(1000 * concurrency, 500_000_000),
                queue=Duration(1000 * concurrency, 40_000_000),
                compute_input=Duration(1000 * concurrency, 10_000_000),
                compute_infer=Duration(1000 * concurrency, 300_000_000),
                compute_output=Duration(1000 * concurrency, 20_000_000),
            )
        )
    return StepResult.combine(concurrency, batch, [sample], server)


def test_csv_has_every_column_and_one_row_per_concurrency(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    write_csv(path, [_result(1, 0.2), _result(2, 0.95), _result(4, 0.3, stats=False)])
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert [row["concurrency"] for row in rows] == ["1", "2", "4"]
    first, second, third = rows
    assert first["requests"] == "1000" and first["errors"] == "0"
    assert float(first["throughput_infer_per_s"]) == 500.0
    assert float(first["latency_p50_ms"]) == 1.0 and float(first["latency_p99_ms"]) == 10.0
    assert float(first["latency_p90_ms"]) == 1.0 and float(first["latency_p95_ms"]) == 10.0
    assert float(first["server_request_us"]) == 500.0
    assert float(first["server_queue_us"]) == 40.0
    assert float(first["server_compute_input_us"]) == 10.0
    assert float(first["server_compute_infer_us"]) == 300.0
    assert float(first["server_compute_output_us"]) == 20.0
    assert float(first["server_avg_batch_size"]) == 2.0
    assert first["client_cpu_percent_per_worker"] == "20.0" and first["client_bound"] == "0"
    assert second["client_bound"] == "1" and second["errors"] == "1"
    assert third["server_queue_us"] == "" and third["server_requests"] == ""


def test_table_is_aligned_and_marks_client_bound_steps() -> None:
    text = table([_result(1, 0.2), _result(16, 0.95)])
    lines = text.splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1
    assert lines[0].split()[:3] == ["concurrency", "infer/s", "avg"]
    assert "rows/s" not in lines[0]
    assert lines[3].split()[0] == "16*" and lines[2].split()[0] == "1"
    assert lines[2].split()[-1] == "20"  # client CPU % of the one worker
    assert "rows/s" in table([_result(1, 0.1, batch=4)])
    assert " - " in table([_result(1, 0.1, stats=False)])


def test_warnings_name_the_client_bound_steps() -> None:
    (line,) = warnings([_result(1, 0.2), _result(8, 0.93)])
    assert line.startswith("warning: concurrency 8:") and "93%" in line and "client-bound" in line


def test_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    write_plot(path, [_result(1, 0.2, batch=2), _result(2, 0.9, batch=2), _result(4, 0.3)], "t")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1100, 450)
