"""``scripts/http_floor.py``: answers captured from the real server are served back byte for
byte, on one connection too (kept alive, pipelined, a body in pieces), infer requests are
counted in the statistics, anything else is refused; and the benchmark measures the floor after
tensorgate in each repeat, paced like one front end, and puts the budget's figures beside issue
15's goals."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts import bench_vs_triton as bench
from scripts.bench_vs_triton import FLOOR, SWEEP_ROW, Measurement, budget_rows, floor_rate
from scripts.http_floor import infer_request, statistics_body
from tests.server_process import ROOT, ServerProcess

FLOOR_SCRIPT = "scripts/http_floor.py"


def _served(floor: ServerProcess) -> int:
    """The infer requests the floor has counted."""
    stats = json.loads(floor.request("GET", "/v2/models/simple/stats")[2])
    count: int = stats["model_stats"][0]["inference_stats"]["success"]["count"]
    return count


@pytest.fixture(scope="module")
def answers(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Captured by the script's own command line."""
    path = tmp_path_factory.mktemp("floor") / "answers.json"
    subprocess.run(
        [sys.executable, FLOOR_SCRIPT, f"--capture-from={server.port}",
         "--model=simple", f"--answers={path}"],
        cwd=ROOT, check=True, timeout=60,
    )
    return path


@pytest.fixture(scope="module")
def floor(answers: Path) -> Iterator[ServerProcess]:
    process = ServerProcess([f"--answers={answers}"], script=FLOOR_SCRIPT)
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(scope="module")
def infer(server: ServerProcess) -> tuple[bytes, dict[str, str]]:
    """A binary infer request for ``simple``: its body and headers."""
    body, header_length = infer_request(json.loads(server.request("GET", "/v2/models/simple")[2]))
    return body, {"Inference-Header-Content-Length": str(header_length)}


def test_the_captured_answers_are_served_byte_for_byte(
    server: ServerProcess, floor: ServerProcess
) -> None:
    for path in ("/v2/health/ready", "/v2/models/simple", "/v2/models/simple/config"):
        real, floored = server.request("GET", path), floor.request("GET", path)
        assert (floored[0], floored[2]) == (real[0], real[2]), path
        assert floored[1].get("Content-Type") == real[1].get("Content-Type"), path


def test_an_infer_request_gets_the_real_answer_and_is_counted(
    server: ServerProcess, floor: ServerProcess, infer: tuple[bytes, dict[str, str]]
) -> None:
    real = server.request("POST", "/v2/models/simple/infer", *infer)
    before = _served(floor)
    for path in ("/v2/models/simple/infer", "/v2/models/simple/versions/1/infer"):
        floored = floor.request("POST", path, *infer)
        assert (floored[0], floored[2]) == (200, real[2])
        assert floored[1]["Inference-Header-Content-Length"] == real[1][
            "Inference-Header-Content-Length"]
    stats = json.loads(floor.request("GET", "/v2/models/simple/stats")[2])["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] - before == 2
    assert stats["execution_count"] == stats["inference_count"] == before + 2


def test_requests_on_one_connection_are_each_answered(
    floor: ServerProcess, infer: tuple[bytes, dict[str, str]]
) -> None:
    """As perf_analyzer sends them: one kept-alive connection; also pipelined, and a body
    arriving in pieces."""
    body, headers = infer
    request = (
        f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: floor\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {headers['Inference-Header-Content-Length']}\r\n\r\n"
    ).encode() + body
    before = _served(floor)
    assert floor.port is not None
    with socket.create_connection(("127.0.0.1", floor.port), timeout=10) as sock, \
            sock.makefile("rb") as reader:
        for _ in range(2):  # kept alive
            sock.sendall(request)
            assert _answer(reader) == 200
        sock.sendall(request * 3)  # pipelined
        assert [_answer(reader) for _ in range(3)] == [200] * 3
        head, half = request[: -len(body)], len(body) // 2
        for piece in (head + body[:half], body[half:-1], body[-1:]):
            sock.sendall(piece)
            time.sleep(0.02)
        assert _answer(reader) == 200
    assert _served(floor) - before == 6


def _answer(reader: Any) -> int:
    """Read one answer with a Content-Length; its status."""
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
    reader.read(length)
    return status


def test_anything_else_is_refused(
    floor: ServerProcess, infer: tuple[bytes, dict[str, str]]
) -> None:
    status, _, body = floor.request("GET", "/v2/models/other")
    assert status == 404 and json.loads(body) == {"error": "Not Found"}
    assert floor.request("POST", "/v2/models/other/infer", *infer)[0] == 404
    assert floor.request("HEAD", "/v2/models/simple")[0] == 405
    assert floor.request("GET", "/v2/health/live")[0] == 200  # the connection still serves


def test_a_zero_request_has_every_input_of_the_model() -> None:
    metadata = {
        "inputs": [{"name": "A", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "B", "datatype": "INT64", "shape": [2]}],
        "outputs": [{"name": "C", "datatype": "FP32", "shape": [-1, 3]}],
    }
    body, header_length = infer_request(metadata)
    header = json.loads(body[:header_length])
    assert [(t["name"], t["shape"], t["parameters"]["binary_data_size"])
            for t in header["inputs"]] == [("A", [1, 3], 12), ("B", [2], 16)]
    assert header["outputs"] == [{"name": "C", "parameters": {"binary_data": True}}]
    assert body[header_length:] == bytes(28)
    with pytest.raises(ValueError, match="BYTES"):
        infer_request({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1]}],
                       "outputs": []})


def test_statistics_count_what_was_served_in_the_captured_version_only() -> None:
    def entry(version: str) -> dict[str, Any]:
        return {"name": "simple", "version": version, "inference_count": 9,
                "execution_count": 4, "batch_stats": [{"batch_size": 1}],
                "inference_stats": {"success": {"count": 9, "ns": 5},
                                    "fail": {"count": 1, "ns": 2}}}

    template = {"model_stats": [entry("1"), entry("2")]}
    served, other = json.loads(statistics_body(template, "simple", "1", 7))["model_stats"]
    assert (served["inference_count"], served["execution_count"]) == (7, 7)
    assert served["inference_stats"]["success"] == {"count": 7, "ns": 0}
    assert served["inference_stats"]["compute_infer"] == {"count": 7, "ns": 0}
    assert served["inference_stats"]["fail"] == {"count": 0, "ns": 0}
    assert served["batch_stats"] == []
    assert (other["inference_count"], other["inference_stats"]["success"]["count"]) == (0, 0)
    assert template["model_stats"][0]["inference_count"] == 9  # the template is left alone


def _measured(server: str, requests: int | None, **cpu_s: float) -> Measurement:
    processes = {"front ends": 2} if "front ends" in cpu_s else {}
    return Measurement(server, SWEEP_ROW.key, infer_per_s=1000.0, requests=requests,
                       cpu_s={**cpu_s, "perf_analyzer": 1.0}, processes=processes)


def test_the_floor_runs_as_busy_as_one_front_end() -> None:
    assert floor_rate(_measured("tensorgate", 10, executor=1.0, **{"front ends": 1.0})) == 500.0
    assert floor_rate(_measured("tensorgate", 10, **{"one process": 1.0})) == 1000.0
    assert floor_rate(Measurement("tensorgate", SWEEP_ROW.key)) is None  # not measured
    assert floor_rate(Measurement("tensorgate", SWEEP_ROW.key, infer_per_s=900.0,
                                  error="perf_analyzer exited 1")) is None


def test_the_budget_puts_each_figure_beside_its_goal() -> None:
    measurements = [
        _measured("tensorgate", 10_000, supervisor=0.0, executor=0.5, **{"front ends": 2.0}),
        _measured(FLOOR, 10_000, floor=1.0),
    ]
    rows = budget_rows(measurements)
    assert [row[1:] for row in rows] == [
        ["100", "≤ 180", "met"],  # the floor: 1 s over 10,000 requests
        ["100", "≤ 60", "not met"],  # front ends 200 µs, less the floor
        ["50.0", "≤ 30", "not met"],
        ["250", "≤ 300", "met"],
    ]


def test_without_a_floor_or_a_split_or_a_count_the_budget_says_n_a() -> None:
    rows = budget_rows([_measured("tensorgate", 1000, **{"one process": 0.2})])
    assert [row[1] for row in rows] == ["n/a", "n/a", "n/a", "200"]
    assert [row[3] for row in rows] == ["n/a", "n/a", "n/a", "met"]
    uncounted = [_measured("tensorgate", count, executor=executor, **{"front ends": 1.0})
                 for count, executor in ((10_000, 0.5), (None, 0.6), (10_000, 0.3))]
    assert [row[1] for row in budget_rows(uncounted)] == ["n/a"] * 4


class _FakeServer:
    http_port = 1

    def __init__(self, *args: object) -> None:
        pass


def _run_with_fakes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, floor: str, rates: list[float]
) -> list[tuple[str, str, bool, float | None]]:
    """``bench_vs_triton.run`` over two rows and ``len(rates)`` repeats, with servers and
    perf_analyzer faked: tensorgate (two front ends) serves ``rates`` in turn (0: its run
    failed). What ``measure`` was asked: (label, row, warm-up, rate)."""
    asked: list[tuple[str, str, bool, float | None]] = []
    served = iter(rates)

    def measure(settings: object, server: object, row: bench.Row, label: str,
                warm_up: bool = False, rate: float | None = None) -> Measurement:
        asked.append((label, row.key, warm_up, rate))
        if label != "tensorgate" or warm_up or row is not SWEEP_ROW:
            return Measurement(label, row.key, infer_per_s=1.0)
        value = next(served)
        return Measurement(label, row.key, infer_per_s=value, processes={"front ends": 2},
                           error=None if value else "perf_analyzer exited 1")

    for name in ("Triton", "Tensorgate", "HttpFloorServer"):
        monkeypatch.setattr(bench, name, _FakeServer)
    monkeypatch.setattr(bench, "start", lambda server, stack: server)
    monkeypatch.setattr(bench, "write_repository", lambda base: tmp_path)
    monkeypatch.setattr(bench, "capture", lambda port, model: {"model": model})
    monkeypatch.setattr(bench, "measure", measure)
    args = argparse.Namespace(
        rows=[SWEEP_ROW, bench.ROW_KEYS["simple-grpc"]], repeat=len(rates),
        frontends_sweep="off", floor=floor, tensorgate_args="", triton_args="",
        triton_ref=tmp_path,
    )
    bench.run(args, bench.Settings(tmp_path, 100, 25, 3))
    return asked


def test_the_benchmark_paces_the_floor_after_tensorgate_in_each_repeat(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = _run_with_fakes(monkeypatch, tmp_path, "on", [4000.0, 0.0, 5000.0])
    floor = [(row, warm_up, rate) for label, row, warm_up, rate in asked if label == FLOOR]
    # warmed up once, then each repeat at half tensorgate's rate; none after a failed run
    assert floor == [(SWEEP_ROW.key, True, 1000), (SWEEP_ROW.key, False, 2000.0),
                     (SWEEP_ROW.key, False, 2500.0)]
    measured = [label for label, row, warm_up, _ in asked if row == SWEEP_ROW.key and not warm_up]
    assert measured[2] == FLOOR and measured.index(FLOOR) > measured.index("tensorgate")


def test_the_benchmark_leaves_the_floor_out_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked = _run_with_fakes(monkeypatch, tmp_path, "off", [4000.0])
    assert FLOOR not in {label for label, *_ in asked}
