"""The HTTP protocol floor: tensorgate's own HTTP layer answering with canned bytes.

Issue 15 budgets a small HTTP request at 180 µs of CPU for the protocol (an infer fast path
below Tornado's ``RequestHandler``) and 60 µs for the front end's real work beyond it.
``bench_vs_triton.py`` measures the front ends' CPU per request. This server gives the other
number: the cost of the protocol alone, under the same perf_analyzer load. It serves the
connections with the front end's classes (``server.http.connection``, ``Exchange``, the
``Listener``), on the same event loop and CPU policy. GET and POST requests are answered with
the status, body and content headers a real server gave for the same call (the ``Date`` it sent
then included). An infer request for the captured model gets the answer the real server gave
for one request of the same inputs; its body is read and dropped. Nothing is decoded, checked,
run or encoded. The statistics answer counts the infer requests answered, so that
perf_analyzer and the benchmark read true request counts.

    python scripts/http_floor.py --capture-from PORT --model simple --answers ANSWERS.json
    python scripts/http_floor.py --answers ANSWERS.json [--port 0]

The first line takes the answers from the server whose HTTP port is PORT (``capture``): its
health, metadata, config and statistics answers, and its answer to one binary infer request of
zeros. The second serves them. Figures measured against it are for people, never a CI gate.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import http.client
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `server` package importable
    sys.path.insert(0, str(ROOT))

from tornado import httputil

from server.protocol.datatypes import BY_NAME

if TYPE_CHECKING:
    from server.http.exchange import Exchange
    from server.http.headers import RequestHeaders

#: The answer's fields kept from the real server's (its Date, as it was then).
_KEPT_FIELDS = ("Content-Type", "Inference-Header-Content-Length", "Date")
_STATS_COUNTED = ("success", "queue", "compute_input", "compute_infer", "compute_output")
_STATS_ZERO = ("fail", "cache_hit", "cache_miss")


@dataclass(frozen=True)
class Answer:
    code: int
    reason: str
    fields: list[tuple[str, str]]
    body: bytes

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "reason": self.reason, "fields": self.fields,
                "body": base64.b64encode(self.body).decode()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        return cls(int(data["code"]), str(data["reason"]),
                   [(str(name), str(value)) for name, value in data["fields"]],
                   base64.b64decode(data["body"]))


_JSON = [("Content-Type", "application/json")]
_NOT_FOUND = Answer(404, "Not Found", _JSON, b'{"error":"Not Found"}')
#: Methods other than GET and POST: no body, so that a HEAD answer keeps the framing.
_NOT_ALLOWED = Answer(405, "Method Not Allowed", [], b"")


# --- capture, from a running server -----------------------------------------------------------


def _fetch(port: int, method: str, path: str, body: bytes | None = None,
           headers: dict[str, str] | None = None) -> Answer:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        fields = [(name, value) for name, value in response.getheaders()
                  if name in _KEPT_FIELDS]
        return Answer(response.status, response.reason, fields, data)
    finally:
        connection.close()


def infer_request(metadata: dict[str, Any]) -> tuple[bytes, int]:
    """A binary infer request of zeros for the model ``metadata`` describes (variable
    dimensions 1), every output asked for as binary data; the body and its JSON's length."""
    inputs, blobs = [], []
    for tensor in metadata["inputs"]:
        datatype = tensor["datatype"]
        known = BY_NAME.get(datatype)
        if known is None or known.is_bytes:
            raise ValueError(f"input {tensor['name']!r}: {datatype} is not captured here")
        shape = [1 if dim < 0 else int(dim) for dim in tensor["shape"]]
        blobs.append(bytes(math.prod(shape) * known.itemsize))
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": datatype,
                       "parameters": {"binary_data_size": len(blobs[-1])}})
    outputs = [{"name": tensor["name"], "parameters": {"binary_data": True}}
               for tensor in metadata["outputs"]]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    return header + b"".join(blobs), len(header)


def capture(port: int, model: str) -> dict[str, Any]:
    """The answers the floor serves, taken from the server on ``port`` (HTTP) for ``model``."""
    answers: dict[str, Answer] = {}
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{model}",
                 f"/v2/models/{model}/config", f"/v2/models/{model}/ready"):
        answers[f"GET {path}"] = _fetch(port, "GET", path)
    metadata = json.loads(answers[f"GET /v2/models/{model}"].body)
    body, header_length = infer_request(metadata)
    infer = _fetch(port, "POST", f"/v2/models/{model}/infer", body, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_length)})
    if infer.code != 200:
        raise RuntimeError(f"the captured infer request failed: {infer.code} {infer.body!r}")
    header_bytes = int(dict(infer.fields)["Inference-Header-Content-Length"])
    version = str(json.loads(infer.body[:header_bytes])["model_version"])
    stats = _fetch(port, "GET", f"/v2/models/{model}/stats")
    return {"model": model, "version": version, "infer": infer.to_json(),
            "stats": json.loads(stats.body),
            "answers": {key: answer.to_json() for key, answer in answers.items()}}


# --- the floor server -------------------------------------------------------------------------


def statistics_body(template: dict[str, Any], model: str, version: str, served: int) -> bytes:
    """The statistics answer: ``template``'s, with the entry of ``model`` ``version`` counting
    the infer requests ``served`` (one execution each, no time spent), every other entry none,
    and no failures or cache lookups anywhere."""
    stats = copy.deepcopy(template)
    for entry in stats["model_stats"]:
        count = served if (entry["name"], entry["version"]) == (model, version) else 0
        entry["inference_count"] = entry["execution_count"] = count
        inference = entry["inference_stats"]
        for key in _STATS_COUNTED:
            inference[key] = {"count": count, "ns": 0}
        for key in _STATS_ZERO:
            inference[key] = {"count": 0, "ns": 0}
        entry["batch_stats"] = []
    return json.dumps(stats).encode()


class Floor:
    """What the port serves (a ``server.http.delegates.ConnectionDelegate``, as ``Routes``):
    canned answers, an infer request counted."""

    def __init__(self, captured: dict[str, Any]) -> None:
        self.model: str = captured["model"]
        self.version: str = captured["version"]
        self.answers = {key: Answer.from_json(value)
                        for key, value in captured["answers"].items()}
        self.infer = Answer.from_json(captured["infer"])
        self.infer_paths = {f"/v2/models/{self.model}/infer",
                            f"/v2/models/{self.model}/versions/{self.version}/infer"}
        self.stats_template: dict[str, Any] = captured["stats"]
        self.served = 0

    def answer(self, method: str, path: str) -> Answer:
        if method == "POST" and path in self.infer_paths:
            self.served += 1
            return self.infer
        if method == "GET" and path.endswith("/stats"):
            body = statistics_body(self.stats_template, self.model, self.version, self.served)
            return Answer(200, "OK", _JSON, body)
        if method not in ("GET", "POST"):
            return _NOT_ALLOWED
        return self.answers.get(f"{method} {path}", _NOT_FOUND)

    def start_request(self, server_conn: object, request_conn: httputil.HTTPConnection) -> _Request:
        return _Request(self, cast("Exchange", request_conn))

    def on_close(self, server_conn: object) -> None:
        pass


class _Request:
    """One request: its body is dropped as it comes, the answer written once it is in."""

    def __init__(self, floor: Floor, connection: Exchange) -> None:
        self._floor = floor
        self._connection = connection
        self._method = ""
        self._path = ""

    def headers_received(
        self, start_line: httputil.RequestStartLine, headers: RequestHeaders
    ) -> None:
        self._method, self._path = start_line.method, start_line.path.partition("?")[0]

    def data_received(self, chunk: bytes) -> None:
        pass

    def finish(self) -> None:
        answer = self._floor.answer(self._method, self._path)
        self._connection.write_answer(answer.code, answer.reason, answer.fields, answer.body)
        self._connection.finish()

    def on_connection_close(self) -> None:
        pass


async def serve(captured: dict[str, Any], address: str, port: int) -> None:
    """Serve until SIGTERM ends the process. The server's modules are imported here, not at
    the top: ``capture`` (which the benchmark imports) needs none of them. As a front end does,
    the heap is settled once the port listens."""
    from server import heap
    from server.http.endpoint import Http, service

    http = Http(service(Floor(captured)), address, port, "HTTPService")
    heap.settle()
    try:
        await asyncio.Event().wait()
    finally:
        http.listener.close()


def main(argv: list[str] | None = None) -> int:
    """Capture the answers (``--capture-from``), or serve them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=Path, required=True,
                        help="the captured answers, as JSON (written with --capture-from)")
    parser.add_argument("--capture-from", type=int, metavar="PORT",
                        help="take the answers from the server on this HTTP port, then exit")
    parser.add_argument("--model", default="simple", help="the model captured (default simple)")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.capture_from is not None:
        args.answers.write_text(json.dumps(capture(args.capture_from, args.model)))
        return 0
    from server.event_loop import run
    from server.processes.cpu_policy import use_batch_policy

    captured = json.loads(args.answers.read_text())
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    use_batch_policy()
    run(serve(captured, args.address, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
