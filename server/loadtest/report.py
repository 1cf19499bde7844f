"""The sweep's results for people and for tools: an aligned table on the terminal, a CSV with
one row per concurrency and every field, and a PNG of throughput and latency against
concurrency (matplotlib's Agg renderer, no display needed).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from server.loadtest.measurements import CLIENT_BUSY_LIMIT, StepResult

#: The CSV's columns, in order (a test pins them: tools downstream read them by name).
CSV_COLUMNS = (
    "concurrency",
    "workers",
    "batch_size",
    "requests",
    "errors",
    "duration_s",
    "throughput_infer_per_s",
    "throughput_rows_per_s",
    "latency_avg_ms",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "server_requests",
    "server_failures",
    "server_request_us",
    "server_queue_us",
    "server_compute_input_us",
    "server_compute_infer_us",
    "server_compute_output_us",
    "server_avg_batch_size",
    "client_cpu_percent_max",
    "client_cpu_percent_per_worker",
    "client_bound",
)


def _number(value: float, digits: int) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def csv_rows(results: Sequence[StepResult]) -> list[dict[str, str]]:
    """The CSV's rows as text (empty where a figure does not exist, e.g. without statistics)."""
    rows = []
    for r in results:
        s = r.server
        rows.append(
            {
                "concurrency": str(r.concurrency),
                "workers": str(r.workers),
                "batch_size": str(r.batch_size),
                "requests": str(r.requests),
                "errors": str(r.errors),
                "duration_s": _number(r.elapsed, 3),
                "throughput_infer_per_s": _number(r.throughput, 2),
                "throughput_rows_per_s": _number(r.rows_per_s, 2),
                "latency_avg_ms": _number(r.latency.avg_ms, 3),
                "latency_p50_ms": _number(r.latency.p50_ms, 3),
                "latency_p90_ms": _number(r.latency.p90_ms, 3),
                "latency_p95_ms": _number(r.latency.p95_ms, 3),
                "latency_p99_ms": _number(r.latency.p99_ms, 3),
                "server_requests": "" if s is None else str(s.requests),
                "server_failures": "" if s is None else str(s.failures),
                "server_request_us": "" if s is None else _number(s.request_us, 1),
                "server_queue_us": "" if s is None else _number(s.queue_us, 1),
                "server_compute_input_us": "" if s is None else _number(s.compute_input_us, 1),
                "server_compute_infer_us": "" if s is None else _number(s.compute_infer_us, 1),
                "server_compute_output_us": "" if s is None else _number(s.compute_output_us, 1),
                "server_avg_batch_size": "" if s is None else _number(s.avg_batch_size, 2),
                "client_cpu_percent_max": _number(r.busiest_worker * 100, 1),
                "client_cpu_percent_per_worker": " ".join(
                    _number(b * 100, 1) for b in r.worker_busy
                ),
                "client_bound": "1" if r.client_bound else "0",
            }
        )
    return rows


def write_csv(path: Path, results: Sequence[StepResult]) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(results))


# --- terminal table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Column:
    header: str
    cell: Callable[[StepResult], str]


def _fixed(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def _server(attribute: str, digits: int = 0) -> Callable[[StepResult], str]:
    """A cell from the step's statistics delta; ``-`` without the statistics extension."""

    def cell(r: StepResult) -> str:
        return "-" if r.server is None else _fixed(getattr(r.server, attribute), digits)

    return cell


def _columns(results: Sequence[StepResult]) -> list[_Column]:
    batched = any(r.batch_size > 1 for r in results)
    columns = [
        _Column("concurrency", lambda r: f"{r.concurrency}{'*' if r.client_bound else ''}"),
        _Column("infer/s", lambda r: _fixed(r.throughput, 1)),
    ]
    if batched:
        columns.append(_Column("rows/s", lambda r: _fixed(r.rows_per_s, 1)))
    columns += [
        _Column("avg ms", lambda r: _fixed(r.latency.avg_ms)),
        _Column("p50 ms", lambda r: _fixed(r.latency.p50_ms)),
        _Column("p90 ms", lambda r: _fixed(r.latency.p90_ms)),
        _Column("p95 ms", lambda r: _fixed(r.latency.p95_ms)),
        _Column("p99 ms", lambda r: _fixed(r.latency.p99_ms)),
        _Column("requests", lambda r: f"{r.requests:,}"),
        _Column("errors", lambda r: f"{r.errors:,}"),
        _Column("queue µs", _server("queue_us")),
        _Column("input µs", _server("compute_input_us")),
        _Column("infer µs", _server("compute_infer_us")),
        _Column("output µs", _server("compute_output_us")),
        _Column("batch", _server("avg_batch_size", 2)),
        _Column(
            "client CPU %",
            lambda r: "/".join(f"{b * 100:.0f}" for b in r.worker_busy) or "-",
        ),
    ]
    return columns


def table(results: Sequence[StepResult]) -> str:
    """Right-aligned columns, one line per concurrency; ``*`` marks a client-bound step."""
    columns = _columns(results)
    cells = [[c.header for c in columns]] + [[c.cell(r) for c in columns] for r in results]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [
        "  ".join(text.rjust(width) for text, width in zip(row, widths, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def warnings(results: Sequence[StepResult]) -> list[str]:
    """One line per step whose figures the client, not the server, may have limited."""
    return [
        f"warning: concurrency {r.concurrency}: a client process was {r.busiest_worker:.0%} "
        f"busy (over {CLIENT_BUSY_LIMIT:.0%} of a core): these figures are client-bound; use "
        "more --workers or a client machine of its own"
        for r in results
        if r.client_bound
    ]


# --- plot -------------------------------------------------------------------------------------


def write_plot(path: Path, results: Sequence[StepResult], title: str) -> None:
    """Two panels against concurrency: throughput (infer/s, and rows/s when batched), and
    p50/p95/p99 latency. Client-bound steps are circled in red."""
    from matplotlib.figure import Figure  # the Agg canvas; no pyplot, no display

    concurrency = [r.concurrency for r in results]
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    figure.suptitle(title)
    throughput, latency = figure.subplots(1, 2)
    throughput.plot(concurrency, [r.throughput for r in results], "o-", label="infer/s")
    if any(r.batch_size > 1 for r in results):
        throughput.plot(concurrency, [r.rows_per_s for r in results], "s--", label="rows/s")
    throughput.set_title("Throughput")
    throughput.set_ylabel("per second")
    throughput.set_ylim(bottom=0)
    for name, values in (
        ("p50", [r.latency.p50_ms for r in results]),
        ("p95", [r.latency.p95_ms for r in results]),
        ("p99", [r.latency.p99_ms for r in results]),
    ):
        latency.plot(concurrency, values, "o-", label=name)
    latency.set_title("Client latency")
    latency.set_ylabel("ms")
    latency.set_ylim(bottom=0)
    bound = [r for r in results if r.client_bound]
    if bound:
        throughput.plot(
            [r.concurrency for r in bound],
            [r.throughput for r in bound],
            "o",
            markersize=14,
            markerfacecolor="none",
            markeredgecolor="red",
            label="client-bound",
        )
    for axes in (throughput, latency):
        axes.set_xlabel("concurrency (requests in flight)")
        axes.set_xticks(concurrency)
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.savefig(path, dpi=100, format="png")
