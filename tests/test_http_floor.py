"""``scripts/http_floor.py``: answers captured from the real server are served back byte for
byte, infer requests are counted in the statistics, anything else is 404; and the benchmark's
budget table puts the floor, the front ends' work beyond it, the executor and the whole server
beside issue 15's goals."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.bench_vs_triton import FLOOR, SWEEP_ROW, Measurement, budget_rows
from scripts.http_floor import capture, infer_request, statistics_body
from tests.server_process import ROOT, ServerProcess

_STARTED = re.compile(r"Started HTTPService at \S+:(\d+)")


class _Floor:
    """The floor script, started here, on a free port."""

    def __init__(self, answers: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "scripts/http_floor.py", f"--answers={answers}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.first_line = self.proc.stdout.readline()  # "Started HTTPService at ..."
        match = _STARTED.search(self.first_line)
        assert match is not None, self.first_line + self.proc.stdout.read()
        self.port = int(match.group(1))

    def request(
        self, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def captured(server: ServerProcess) -> dict[str, object]:
    assert server.port is not None
    return capture(server.port, "simple")


@pytest.fixture(scope="module")
def floor(
    captured: dict[str, object], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Floor]:
    answers = tmp_path_factory.mktemp("floor") / "answers.json"
    answers.write_text(json.dumps(captured))
    process = _Floor(answers)
    yield process
    process.proc.terminate()
    process.proc.communicate(timeout=10)


def test_the_captured_answers_are_served_byte_for_byte(
    server: ServerProcess, floor: _Floor
) -> None:
    for path in ("/v2/health/ready", "/v2/models/simple", "/v2/models/simple/config"):
        real, floored = server.request("GET", path), floor.request("GET", path)
        assert (floored[0], floored[2]) == (real[0], real[2]), path
        assert floored[1].get("Content-Type") == real[1].get("Content-Type"), path


def test_an_infer_request_gets_the_real_answer_and_is_counted(
    server: ServerProcess, floor: _Floor
) -> None:
    metadata = json.loads(server.request("GET", "/v2/models/simple")[2])
    body, header_length = infer_request(metadata)
    headers = {"Inference-Header-Content-Length": str(header_length)}
    real = server.request("POST", "/v2/models/simple/infer", body, headers)
    before = json.loads(floor.request("GET", "/v2/models/simple/stats")[2])
    for _ in range(3):
        floored = floor.request("POST", "/v2/models/simple/infer", body, headers)
        assert (floored[0], floored[2]) == (200, real[2])
        assert floored[1]["Inference-Header-Content-Length"] == real[1][
            "Inference-Header-Content-Length"]
    after = json.loads(floor.request("GET", "/v2/models/simple/stats")[2])
    counts = [stats["model_stats"][0]["inference_stats"]["success"]["count"]
              for stats in (before, after)]
    assert counts[1] - counts[0] == 3
    assert after["model_stats"][0]["execution_count"] == counts[1]


def test_anything_else_is_not_found(floor: _Floor) -> None:
    status, _, body = floor.request("GET", "/v2/models/other")
    assert status == 404 and json.loads(body) == {"error": "Not Found"}


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


def test_statistics_count_what_was_served_and_no_time() -> None:
    template = {"model_stats": [{
        "name": "simple", "version": "1", "inference_count": 9, "execution_count": 4,
        "inference_stats": {"success": {"count": 9, "ns": 5}, "fail": {"count": 1, "ns": 2}},
        "batch_stats": [{"batch_size": 1}],
    }]}
    stats = json.loads(statistics_body(template, 7))["model_stats"][0]
    assert (stats["inference_count"], stats["execution_count"]) == (7, 7)
    assert stats["inference_stats"]["success"] == {"count": 7, "ns": 0}
    assert stats["inference_stats"]["compute_infer"] == {"count": 7, "ns": 0}
    assert stats["inference_stats"]["fail"] == {"count": 0, "ns": 0}
    assert stats["batch_stats"] == []
    assert template["model_stats"][0]["inference_count"] == 9  # the template is left alone


def _measured(server: str, requests: int, **cpu_s: float) -> Measurement:
    return Measurement(server, SWEEP_ROW.key, infer_per_s=1000.0, requests=requests,
                       cpu_s={**cpu_s, "perf_analyzer": 1.0})


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


def test_without_a_floor_or_a_split_the_budget_says_n_a() -> None:
    rows = budget_rows([_measured("tensorgate", 1000, **{"one process": 0.2})])
    assert [row[1] for row in rows] == ["n/a", "n/a", "n/a", "200"]
    assert [row[3] for row in rows] == ["n/a", "n/a", "n/a", "met"]
