"""A model that fails at run time fails only its own request, with a 500, and is logged."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.model_repos import build_napping_repository, slow_http_request
from tests.server.http.helpers import (
    error_of,
    json_input,
    parse_raw_response,
    post_json,
    read_response,
)
from tests.server_process import ServerProcess, start_server


def _rows_request(count: int, request_id: str) -> dict[str, object]:
    return {
        "id": request_id,
        "inputs": [json_input("INPUT0", "FP32", [1, count], [1.0] * count)],
    }


def test_model_fault_is_500_logged_and_the_model_keeps_serving(
    server: ServerProcess, assert_still_serving: None
) -> None:
    response = post_json(server, "rows_of_three", _rows_request(4, "bad-one"))
    assert response[0] == 500
    message = error_of(response)
    assert message.startswith("model 'rows_of_three' version 1 failed: ")
    assert "Reshape" in message

    status, _, body = post_json(server, "rows_of_three", _rows_request(6, "good-one"))
    assert status == 200, body
    output = json.loads(body)["outputs"][0]
    assert output["shape"] == [2, 3] and output["data"] == [1.0] * 6

    # (the executor's own line about 'bad-one' may be read before the front end's)
    server.wait_for_log("internal error for request id 'bad-one'", timeout=5)


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(
        # the busy request (256 rows) sleeps 2.6 s on the one instance
        build_napping_repository(tmp_path_factory.mktemp("slow"), 0.01), args=("--log-verbose=1",)
    )
    assert process.port is not None, process.log
    yield process
    process.stop()


def test_disconnected_client_request_is_dropped(slow_server: ServerProcess) -> None:
    """The one instance is busy with a long request; a queued request whose client hangs up
    is dropped, and a later request is still answered."""
    assert slow_server.port is not None
    busy = socket.create_connection(("127.0.0.1", slow_server.port))
    busy.sendall(slow_http_request(256, "busy"))
    time.sleep(0.1)
    quitter = socket.create_connection(("127.0.0.1", slow_server.port))
    quitter.sendall(slow_http_request(1, "quitter"))
    time.sleep(0.1)
    quitter.close()
    status, _, body = slow_server.request(
        "POST",
        "/v2/models/slow/infer",
        json.dumps(
            {"id": "after", "inputs": [json_input("INPUT0", "FP32", [1, 2048], [2.0] * 2048)]}
        ).encode(),
    )
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2.0] * 2048
    assert parse_raw_response(read_response(busy))[0] == 200
    busy.close()
    deadline = time.monotonic() + 5
    while "'quitter' to model" not in slow_server.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "request id 'quitter' to model 'slow' cancelled by its client" in slow_server.log
