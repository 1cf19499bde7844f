"""The real split server (supervisor, executor, two front ends) under load: one table of
statistics whichever front end took a request; a front end killed with SIGKILL under HTTP
and gRPC load is replaced and no client hangs; the executor killed with SIGKILL fails every pending request at once and
the server exits 1 with no process left; front ends never import ONNX Runtime or CuPy; the
children run the batch CPU policy."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import psutil
import pytest

from scripts import make_models
from server.generated import grpc_service_pb2 as pb
from server.generated import grpc_service_pb2_grpc as pb_grpc
from tests.model_repos import build_slow_start_repository
from tests.server.grpc.raw_http2 import RawHttp2Client, grpc_message
from tests.server_process import ServerProcess, start_server

FRONTENDS = 2


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_models.save(make_models.add_sub("INT32", 16), root / "simple" / "1" / "model.onnx")
    return root


@pytest.fixture
def server(models: Path) -> Iterator[ServerProcess]:
    process = start_server(models, args=(f"--frontends={FRONTENDS}",))
    assert process.port is not None, process.log
    yield process
    process.stop()
    _assert_gone(process)


def _children(server: ServerProcess, role: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(server.proc.pid).children():
        try:
            if f"server.processes.{role}" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _assert_gone(server: ServerProcess) -> None:
    """Neither the supervisor nor any process it started is left (children are found by the
    environment they were given, which names the supervisor)."""
    deadline = time.monotonic() + 10
    while True:
        left = []
        for proc in psutil.process_iter(["pid", "environ"]):
            described = (proc.info.get("environ") or {}).get("TENSORGATE_CHILD")
            if described and json.loads(described).get("supervisor_pid") == server.proc.pid:
                left.append(proc.info["pid"])
        if not left:
            return
        assert time.monotonic() < deadline, f"processes left: {left}"
        time.sleep(0.1)


def _body() -> bytes:
    data = list(range(16))
    return json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": data},
    ]}).encode()


class Load(threading.Thread):
    """Requests on fresh connections until stopped; every outcome is counted, none may hang."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.outcomes: dict[str, int] = {}
        self.wrong: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                connection.request("POST", "/v2/models/simple/infer", _body())
                response = connection.getresponse()
                text = response.read()
                key = str(response.status)
                if response.status == 200:
                    out = json.loads(text)["outputs"][0]["data"]
                    if out != [2 * i for i in range(16)]:
                        self.wrong.append(text.decode()[:200])
            except TimeoutError:
                key = "hung"
            except OSError as exc:
                key = type(exc).__name__
            finally:
                connection.close()  # also after a reset: no socket is left to the collector
            self.outcomes[key] = self.outcomes.get(key, 0) + 1


class GrpcLoad(Load):
    """ModelInfer calls on one channel (grpc reconnects it when its connection goes) until
    stopped; a call still unanswered after 10 s is "hung"."""

    def run(self) -> None:
        data = np.arange(16, dtype=np.int32).tobytes()
        request = pb.ModelInferRequest(
            model_name="simple",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(name=name, datatype="INT32", shape=[1, 16])
                for name in ("INPUT0", "INPUT1")
            ],
            raw_input_contents=[data, data],
        )
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            while not self.stop.is_set():
                try:
                    reply = stub.ModelInfer(request, timeout=10)
                    key = "OK"
                    out = np.frombuffer(reply.raw_output_contents[0], np.int32).tolist()
                    if out != [2 * i for i in range(16)]:
                        self.wrong.append(str(out))
                except grpc.RpcError as error:
                    code = error.code()
                    key = "hung" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
                    if key == "UNAVAILABLE":
                        time.sleep(0.01)  # reconnecting
                self.outcomes[key] = self.outcomes.get(key, 0) + 1


def _loads(server: ServerProcess) -> list[Load]:
    """Two HTTP loads and two gRPC loads, started."""
    assert server.port is not None and server.grpc_port is not None
    loads = [Load(server.port), Load(server.port), GrpcLoad(server.grpc_port),
             GrpcLoad(server.grpc_port)]
    for load in loads:
        load.start()
    return loads


def _answered(loads: list[Load]) -> int:
    return sum(load.outcomes.get("200", 0) + load.outcomes.get("OK", 0) for load in loads)


def test_statistics_count_every_request_once_whichever_front_end_took_it(
    server: ServerProcess,
) -> None:
    assert len(_children(server, "frontend")) == FRONTENDS
    assert server.port is not None
    for _ in range(40):  # fresh connections: both front ends take some
        status, _, _ = server.request("POST", "/v2/models/simple/infer", _body())
        assert status == 200
    stats = json.loads(server.request("GET", "/v2/models/simple/stats")[2])["model_stats"][0]
    assert stats["inference_count"] == 40
    assert stats["inference_stats"]["success"]["count"] == 40
    metrics = server.metrics()
    assert re.search(r'nv_inference_request_success\{model="simple",version="1"\} 40\b', metrics)


def _listening_inodes(front_end: psutil.Process, port: int) -> set[str]:
    """The socket inodes ``front_end`` listens on ``port`` with."""
    return {
        os.readlink(f"/proc/{front_end.pid}/fd/{c.fd}")
        for c in front_end.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_http_connections_are_spread_over_the_front_ends(server: ServerProcess) -> None:
    """Each front end accepts on its own SO_REUSEPORT socket (not one shared by all, where the
    first to wake took a burst of connections): 16 connections reach both front ends (one
    getting none has a chance of 2 in 65,536)."""
    assert server.port is not None
    listening = [_listening_inodes(f, server.port) for f in _children(server, "frontend")]
    assert all(len(inodes) == 1 for inodes in listening), listening
    assert len(set.union(*listening)) == FRONTENDS, listening
    connections = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                   for _ in range(16)]
    try:
        for connection in connections:
            connection.connect()
        for connection in connections:  # each is accepted and served, and stays open
            connection.request("POST", "/v2/models/simple/infer", _body())
            response = connection.getresponse()
            assert response.status == 200, response.read()
            response.read()
        taken = {
            front_end.pid: sum(
                1 for c in front_end.net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == server.port
            )
            for front_end in _children(server, "frontend")
        }
    finally:
        for connection in connections:
            connection.close()
    assert len(taken) == FRONTENDS and sum(taken.values()) == 16, taken
    assert all(count > 0 for count in taken.values()), taken


def test_front_ends_never_import_onnxruntime_or_cupy(server: ServerProcess) -> None:
    """Nor grpcio: gRPC is served by the server's own HTTP/2 (no grpc core threads)."""
    for front_end in _children(server, "frontend"):
        maps = Path(f"/proc/{front_end.pid}/maps").read_text()
        assert "onnxruntime" not in maps and "cupy" not in maps and "cygrpc" not in maps
    (executor,) = _children(server, "executor")
    assert "onnxruntime" in Path(f"/proc/{executor.pid}/maps").read_text()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's SCHED_BATCH policy")
def test_every_thread_of_the_children_runs_the_batch_policy(server: ServerProcess) -> None:
    """Also the threads started after the policy was taken (ONNX Runtime's, the loop's
    helpers), which inherit it: a woken process never preempts the one that woke it."""
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
        pytest.skip("these tests run under a chosen CPU policy, which the server keeps")
    children = _children(server, "executor") + _children(server, "frontend")
    assert len(children) == 1 + FRONTENDS
    for process in children:
        threads = [t.id for t in process.threads()]
        policies = {os.sched_getscheduler(tid) for tid in threads}
        assert policies == {os.SCHED_BATCH}, (process.pid, len(threads), policies)
    assert os.sched_getscheduler(server.proc.pid) == os.SCHED_OTHER  # (it serves nothing)


def test_a_front_end_killed_under_load_is_replaced_and_no_client_hangs(
    server: ServerProcess,
) -> None:
    loads = _loads(server)
    time.sleep(1.0)
    victim = _children(server, "frontend")[0]
    os.kill(victim.pid, signal.SIGKILL)
    server.wait_for_log("front end", timeout=10)
    deadline = time.monotonic() + 20
    while True:  # a new front end has taken its place
        current = [p.pid for p in _children(server, "frontend")]
        if len(current) == FRONTENDS and victim.pid not in current:
            break
        assert time.monotonic() < deadline, server.log
        time.sleep(0.1)
    time.sleep(1.0)
    for load in loads:
        load.stop.set()
    for load in loads:
        load.join(30)
        assert not load.is_alive()
        assert not load.wrong, load.wrong[:3]
        assert "hung" not in load.outcomes, load.outcomes
    assert _answered(loads) > 20, [load.outcomes for load in loads]
    for load in loads[2:]:  # both gRPC loads were served (again) after the kill
        assert load.outcomes.get("OK", 0) > 0, load.outcomes
    assert server.request("GET", "/v2/health/ready")[0] == 200


def test_the_executor_killed_under_load_fails_pending_requests_and_ends_the_server(
    models: Path,
) -> None:
    server = start_server(models, args=(f"--frontends={FRONTENDS}",))
    try:
        assert server.port is not None, server.log
        loads = _loads(server)
        time.sleep(1.0)
        (executor,) = _children(server, "executor")
        os.kill(executor.pid, signal.SIGKILL)
        assert server.wait_exit(30) == 1
        for load in loads:
            load.stop.set()
        for load in loads:
            load.join(30)
            assert not load.is_alive()
            assert "hung" not in load.outcomes, load.outcomes
            assert not load.wrong, load.wrong[:3]
        assert "the executor" in server.log and "ended" in server.log, server.log
        _assert_gone(server)
    finally:
        server.stop()


def test_sigterm_under_load_drains_and_leaves_no_process(server: ServerProcess) -> None:
    loads = _loads(server)
    time.sleep(1.0)
    assert server.stop() == 0
    for load in loads:
        load.stop.set()
    for load in loads:
        load.join(30)
        assert "hung" not in load.outcomes, load.outcomes
        assert not load.wrong, load.wrong[:3]
        # Answered, refused while stopping (503 / UNAVAILABLE), the connection refused once
        # closed, or reset by the stop before any request was read from it (still in the
        # listening socket's queue): seen when reading, or as a broken pipe when the reset
        # came before the client had written its request.
        assert set(load.outcomes) <= {"200", "503", "ConnectionRefusedError", "OK",
                                      "RemoteDisconnected", "ConnectionResetError",
                                      "BrokenPipeError", "UNAVAILABLE"}, load.outcomes
    _assert_gone(server)


def test_every_layout_answers_the_same(models: Path) -> None:
    """The same request through one process and through front ends: the same bytes."""
    answers = []
    for layout in ("--frontends=0", "--frontends=1", f"--frontends={FRONTENDS}"):
        process = start_server(models, args=(layout,))
        try:
            status, _, body = process.request("POST", "/v2/models/simple/infer", _body())
            assert status == 200, body
            missing = process.request("POST", "/v2/models/nope/infer", _body())
            answers.append((body, missing[0], missing[2]))
        finally:
            assert process.stop() == 0
    assert answers[0] == answers[1] == answers[2]


def test_a_full_arena_is_503_before_the_body_is_stored_and_recovers(models: Path) -> None:
    """Arena of four 1 MiB blocks (two bodies of --http-max-input-size at least): four slow
    uploads hold it; the fifth is refused at once; once they are gone, requests are served."""
    import socket

    server = start_server(models, args=(
        "--frontends=1", "--http-max-input-size=1048576", "--pinned-memory-pool-byte-size=4194304",
    ))
    try:
        assert server.port is not None, server.log
        head = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: 1000000\r\n\r\n")
        slow: list[socket.socket] = []
        try:
            for _ in range(4):
                sock = socket.create_connection(("127.0.0.1", server.port))
                sock.sendall(head + b"{")
                slow.append(sock)
            time.sleep(0.5)
            # The client sends its whole body before it reads: the answer must still reach it.
            status, _, text = server.request(
                "POST", "/v2/models/simple/infer", b"{}".ljust(1_000_000)
            )
        finally:
            for sock in slow:
                sock.close()
        assert status == 503, text
        assert b"request-body arena" in text  # the arena refused it, not another budget
        deadline = time.monotonic() + 10
        while server.request("POST", "/v2/models/simple/infer", _body())[0] != 200:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.1)
        assert server.stop() == 0
    finally:
        server.stop()


def _ident_request(request_id: str, model: str = "ident") -> pb.ModelInferRequest:
    """About 600 KB: a ModelStreamInfer message that takes a 1 MiB arena block."""
    data = np.full((1, 150_000), float(len(request_id)), dtype=np.float32)
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(data.shape))
    request.raw_input_contents.append(data.tobytes())
    return request


def _arena_blocks_all_free(server: ServerProcess, blocks: int) -> bool:
    """``blocks`` slow uploads of a whole body each are all taken (none answered at once),
    and one more is refused: every block of the arena is free."""
    import socket

    head = (b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 1000000\r\n\r\n{")
    held: list[socket.socket] = []
    try:
        for _ in range(blocks + 1):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.settimeout(0.5)
            sock.sendall(head)
            held.append(sock)
        answered = []
        for sock in held:
            try:
                answered.append(sock.recv(12) == b"HTTP/1.1 503")
            except TimeoutError:
                answered.append(False)
        return answered == [False] * blocks + [True]
    finally:
        for sock in held:
            sock.close()


def test_abandoned_streams_of_large_messages_leave_the_arena_whole(models: Path) -> None:
    """ModelStreamInfer messages of 600 KB, each received into its own block of a four-block
    arena (more at once than it holds: the rest come as bytes), answered, failed, given up
    with replies and messages unread, cut short mid-message: afterwards every block is free."""
    make_models.save(
        make_models.identity("FP32", ["batch", -1]), models / "ident" / "1" / "model.onnx"
    )
    server = start_server(models, args=(
        "--frontends=1", "--http-max-input-size=1048576", "--pinned-memory-pool-byte-size=4194304",
    ))
    try:
        assert server.port is not None and server.grpc_port is not None, server.log
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            requests = [_ident_request(f"r{i}") for i in range(6)]
            requests.insert(3, _ident_request("bad", "no_such_model"))
            replies = list(stub.ModelStreamInfer(iter(requests), timeout=30))
            assert sorted(r.infer_response.id for r in replies if not r.error_message) == [
                f"r{i}" for i in range(6)
            ]
            assert [r.error_message for r in replies if r.error_message] == [
                "Request for unknown model: 'no_such_model' is not found"
            ]
            for round_ in range(20):
                call = stub.ModelStreamInfer(
                    iter([_ident_request(f"g{round_}-{i}") for i in range(8)]), timeout=30
                )
                next(call)  # one reply read, the others left
                call.cancel()
        path = "/inference.GRPCInferenceService/ModelStreamInfer"
        for _ in range(10):
            raw = RawHttp2Client(server.grpc_port)
            # (the server's window is larger)
            raw.wait(cast(Callable[[], bool], lambda raw=raw: bool(raw.settings)))
            stream = raw.start(path)
            wire = grpc_message(_ident_request("cut").SerializeToString())
            raw.h2.send_data(stream, wire + wire[: len(wire) // 2])
            raw.flush()
            time.sleep(0.02)
            raw.close()  # the connection goes mid-message
        deadline = time.monotonic() + 10
        while not _arena_blocks_all_free(server, 4):
            assert time.monotonic() < deadline, "arena blocks still held"
            time.sleep(0.2)
        assert server.request("POST", "/v2/models/simple/infer", _body())[0] == 200
        assert server.stop() == 0
    finally:
        server.stop()


def test_front_ends_started_beside_a_loading_executor_stop_at_once(tmp_path: Path) -> None:
    """Front ends start with the executor and wait for it to take their connections; a stop
    before it has loaded its models ends them at once, not at their exit deadline."""
    server = start_server(
        build_slow_start_repository(tmp_path),
        args=(f"--frontends={FRONTENDS}", "--exit-timeout-secs=3", "--log-verbose=1"),
        timeout=0,
    )
    try:
        server.wait_for_log("initializing slow_start")
        for index in range(FRONTENDS):
            server.wait_for_log(f"front end {index} waiting for the executor")
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit(30) == 0, server.log
        for index in range(FRONTENDS):
            assert f"front end {index} stopped before the executor was ready" in server.log
        assert "did not stop in time" not in server.log and "Started" not in server.log
        _assert_gone(server)
    finally:
        server.stop()
