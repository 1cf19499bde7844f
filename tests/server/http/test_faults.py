"""A model that fails at run time fails only its own request, with a 500, and is logged."""

from __future__ import annotations

import json
import time

from tests.server.http.helpers import error_of, json_input, post_json
from tests.server_process import ServerProcess


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

    deadline = time.monotonic() + 5
    while "'bad-one'" not in server.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "internal error for request id 'bad-one'" in server.log
