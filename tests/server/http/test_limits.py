"""Connection-level limits: oversized headers, bodies that never finish, idle keep-alive
connections; each one closes that connection only, the server keeps answering, no handler is
left behind, and memory stays flat over many rejected requests."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.server.http.helpers import assert_simple_ok, post_json
from tests.server_process import EXAMPLES, ServerProcess, one_front_end, start_server

ABSURD_SHAPE = (
    b'{"inputs": [{"name": "INPUT0", "shape": [1, 99999999], "datatype": "INT32", "data": [1]}]}'
)
LIMITS = (
    "--http-max-header-size=4096",
    "--http-idle-timeout-secs=1",
    "--http-body-timeout-secs=1",
    "--http-max-input-size=65536",
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES, args=LIMITS)
    assert process.port is not None, process.log
    yield process
    process.stop()
    # A handler still waiting for a body that never came would be failed at shutdown.
    assert "500 POST" not in process.log, process.log


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (it must send nothing first)."""
    sock.settimeout(seconds)
    started = time.monotonic()
    assert sock.recv(1000) == b""
    return time.monotonic() - started


def _still_serving(server: ServerProcess) -> None:
    assert_simple_ok(server)


def test_oversized_headers_close_the_connection(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port or 0)) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
        _closed_within(sock, 5)
    _still_serving(server)


@pytest.mark.parametrize(
    "sent",
    [
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
        b"GET /v2 HTTP/1.1\r\nHost: x\r\n",  # headers that never end
        b"",  # a connection that never says anything
    ],
    ids=["body", "headers", "idle"],
)
def test_stalled_clients_are_cut_off(server: ServerProcess, sent: bytes) -> None:
    with socket.create_connection(("127.0.0.1", server.port or 0)) as sock:
        sock.sendall(sent)
        assert _closed_within(sock, 10) < 5
    _still_serving(server)


def test_memory_stays_flat_over_rejected_requests(server: ServerProcess) -> None:
    """Requests refused for their size, their JSON or their shape, 600 of them after a
    warm-up: the server's resident memory, all its processes together, grows by less than
    4 MiB."""
    bad = [
        ("POST", "/v2/models/simple/infer", b"{" * 5000),
        ("POST", "/v2/models/simple/infer", ABSURD_SHAPE),
        ("POST", "/v2/models/simple/infer", b"x" * 70000),  # over --http-max-input-size
        ("POST", "/v2/models/nope/infer", b"{}"),
        ("GET", "/v2/models/simple/versions/999", None),
    ]

    def burst(count: int) -> None:
        for index in range(count):
            method, path, body = bad[index % len(bad)]
            status, _, _ = server.request(method, path, body)
            assert 400 <= status < 500, (path, status)

    burst(200)
    before = server.resident_bytes()
    burst(600)
    grown = server.resident_bytes() - before
    assert grown < 4 << 20, f"RSS grew by {grown / 2**20:.1f} MiB over 600 rejected requests"
    _still_serving(server)


def test_json_data_that_decodes_past_the_body_limit_is_refused(server: ServerProcess) -> None:
    """A body under --http-max-input-size (64 KiB here) whose JSON data stands for more bytes
    than that (``0,`` is two characters and four bytes of FP32) is refused like an oversize
    body, before an array is made; the same data within the limit is served."""
    def body(count: int) -> bytes:
        text = ",".join("0" * count)
        return (
            b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1,%d],"data":[%s]}]}'
            % (count, text.encode())
        )

    large = body(30_000)
    assert len(large) < 65536
    status, _, text = post_json(server, "identity_fp32", large)
    assert status == 400, text
    assert json.loads(text)["error"] == (
        "request JSON data of 120000 bytes (decoded, up to input 'INPUT0') exceeds the maximum "
        "allowed input size of 65536 bytes. Use --http-max-input-size to increase the limit."
    )
    status, _, text = post_json(server, "identity_fp32", body(16_000))
    assert status == 200, text
    assert json.loads(text)["outputs"][0]["shape"] == [1, 16_000]
    _still_serving(server)


def test_admission_control_on_bodies_in_flight() -> None:
    """A slow upload holds its buffer; while it does, a request that would take the bodies in
    flight past --http-max-inflight-bytes is answered 503 at once, and is served again once the
    first one is done."""
    process = start_server(
        EXAMPLES, args=(
            "--http-max-inflight-bytes=300000", "--http-max-input-size=262144", *one_front_end()
        ),
    )
    try:
        assert process.port is not None, process.log
        body = b'{"inputs": []}'.ljust(150_000)
        with socket.create_connection(("127.0.0.1", process.port)) as slow:
            slow.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:1000]
            )
            time.sleep(0.3)  # its buffer is taken
            status, _, text = process.request(
                "POST", "/v2/models/simple/infer", b"{}".ljust(100_000)
            )
            assert status == 503, text
            assert b"--http-max-inflight-bytes" in text
            slow.sendall(body[1000:])
            slow.settimeout(10)
            assert slow.recv(100).startswith(b"HTTP/1.1 400")  # no inputs: the model refuses
        status, _, text = process.request("POST", "/v2/models/simple/infer", b"{}".ljust(100_000))
        assert status == 400, text  # admitted again; refused for its content
        _still_serving(process)
    finally:
        process.stop()


def _chunked(body: bytes, size: int = 50_000) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


def test_chunked_and_compressed_bodies_count_against_the_budget() -> None:
    """A chunked body is charged as it grows; a compressed one what it may inflate to."""
    import gzip

    process = start_server(
        EXAMPLES, args=(
            "--http-max-inflight-bytes=300000", "--http-max-input-size=262144", *one_front_end()
        ),
    )
    try:
        assert process.port is not None, process.log
        body = b'{"inputs": []}'.ljust(200_000)
        with socket.create_connection(("127.0.0.1", process.port)) as sock:
            sock.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body)
            )
            sock.settimeout(10)
            assert sock.recv(100).startswith(b"HTTP/1.1 400"), "alone, it fits"
        with socket.create_connection(("127.0.0.1", process.port)) as slow:
            held = b'{"inputs": []}'.ljust(100_000)  # 128 KiB class
            slow.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(held)}\r\n\r\n".encode() + held[:100]
            )
            time.sleep(0.3)
            status, _, text = process.request(
                "POST", "/v2/models/simple/infer", gzip.compress(body),
                {"Content-Encoding": "gzip"},
            )
            assert status == 503 and b"--http-max-inflight-bytes" in text, text
            # A chunked body starts small (admitted) and is refused as it grows past the budget.
            with socket.create_connection(("127.0.0.1", process.port)) as sock:
                try:
                    sock.sendall(
                        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body)
                    )
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before the last chunk
                sock.settimeout(10)
                answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"--http-max-inflight-bytes" in answer
        _still_serving(process)
    finally:
        process.stop()


def test_a_refusal_to_a_client_waiting_for_100_continue_closes_the_connection() -> None:
    process = start_server(EXAMPLES, args=("--http-max-input-size=1000",))
    try:
        with socket.create_connection(("127.0.0.1", process.port or 0)) as sock:
            sock.sendall(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            sock.settimeout(10)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"100 (Continue)" not in answer, "no interim answer after the final one"
        _still_serving(process)
    finally:
        process.stop()
    assert "Future exception was never retrieved" not in process.log, process.log
