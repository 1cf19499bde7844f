"""The logging extension against a real server, in both process layouts (one process, and two
front ends with the executor): ``GET/POST /v2/logging`` and the ``LogSettings`` RPC, through
raw HTTP and NVIDIA's ``tritonclient``; the changes show in the server's log (per-request
lines at verbose 1, no INFO lines with ``log_info`` false, the ISO8601 form), from every
process; the refusals with Triton's texts."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models
from server.generated import grpc_service_pb2 as pb
from server.generated import grpc_service_pb2_grpc as pb_grpc
from tests.server_process import ServerProcess, start_server

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
_DEFAULT_LINE = re.compile(r"^[IWEV]\d{4} \d\d:\d\d:\d\d\.\d{6} (\d+) ")
_ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWEV] (\d+) ")


@pytest.fixture(scope="module", params=["one process", "split"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    ServerProcess
]:
    """Its own server (the tests change its log settings), one model: ``echo``."""
    root = tmp_path_factory.mktemp("logging_repo")
    make_models.save(make_models.identity("FP32", ["batch", 4]), root / "echo" / "1" / "model.onnx")
    frontends = "--frontends=0" if request.param == "one process" else "--frontends=2"
    process = start_server(root, args=(frontends,))
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture
def defaults(server: ServerProcess) -> Iterator[ServerProcess]:
    """The server with its log settings put back to the flags' after the test."""
    yield server
    changes = {k: v for k, v in DEFAULTS.items() if k != "log_file"}
    status, _, body = _post(server, changes)
    assert status == 200, body


def _post(server: ServerProcess, body: Any) -> tuple[int, dict[str, str], bytes]:
    return server.request("POST", "/v2/logging", json.dumps(body).encode())


def _infer(server: ServerProcess, request_id: str) -> None:
    body = {
        "id": request_id,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
    }
    status, _, answer = server.request("POST", "/v2/models/echo/infer", json.dumps(body).encode())
    assert status == 200, answer


def _lines_after(server: ServerProcess, mark: int, text: str, timeout: float = 15.0) -> list[str]:
    """The log lines printed since line ``mark``, once one of them contains ``text``."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in server.lines[mark:]):
        assert time.monotonic() < deadline, "".join(server.lines[mark:])
        time.sleep(0.02)
    return server.lines[mark:]


def test_get_answers_the_flags_settings(server: ServerProcess) -> None:
    status, headers, body = server.request("GET", "/v2/logging")
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == DEFAULTS


def test_server_metadata_lists_logging(server: ServerProcess) -> None:
    _, _, body = server.request("GET", "/v2")
    assert "logging" in json.loads(body)["extensions"]


def test_post_changes_only_the_named_settings_and_answers_all(defaults: ServerProcess) -> None:
    status, _, body = _post(defaults, {"log_verbose_level": 2, "log_warning": None, "other": 1})
    assert status == 200, body
    assert json.loads(body) == {**DEFAULTS, "log_verbose_level": 2}
    assert json.loads(defaults.request("GET", "/v2/logging")[2])["log_verbose_level"] == 2


def test_verbose_one_logs_each_request_and_info_off_silences_it(defaults: ServerProcess) -> None:
    _infer(defaults, "quiet-0")
    assert _post(defaults, {"log_verbose_level": 1})[0] == 200
    mark = len(defaults.lines)
    _infer(defaults, "loud-1")
    _lines_after(defaults, mark, "id='loud-1'")
    assert "id='quiet-0'" not in defaults.log
    assert _post(defaults, {"log_info": False})[0] == 200
    mark = len(defaults.lines)
    _infer(defaults, "muted-2")
    assert _post(defaults, {"log_info": True})[0] == 200
    _infer(defaults, "back-3")
    after = "".join(_lines_after(defaults, mark, "id='back-3'"))
    assert "muted-2" not in after


def test_every_process_takes_the_new_format(defaults: ServerProcess) -> None:
    """Access lines come from the front ends, per-request lines from the executor: after the
    change all of them are ISO8601."""
    assert _post(defaults, {"log_verbose_level": 1, "log_format": "ISO8601"})[0] == 200
    mark = len(defaults.lines)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: _infer(defaults, f"iso-{i}"), range(24)))
    _lines_after(defaults, mark, "id='iso-23'")
    time.sleep(0.2)  # the last access lines
    lines = [line for line in defaults.lines[mark:] if "] " in line]
    assert lines and all(_ISO_LINE.match(line) for line in lines), lines
    assert not any(_DEFAULT_LINE.match(line) for line in lines)
    assert any("tornado.access" in line for line in lines), lines
    pids = {match.group(1) for line in lines if (match := _ISO_LINE.match(line))}
    split = "--frontends=2" in cast("list[str]", defaults.proc.args)
    assert len(pids) >= (2 if split else 1), lines  # in the split layout: executor, front end


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"log_file": "x.log"}, 501, "log file location can not be updated through network protocol"),
        ({"log_info": "false"}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_error": 1}, 400, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, 400,
         "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": True}, 400,
         "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 8601}, 400, "attempt to access JSON non-string as string"),
        ({"log_format": "iso"}, 400, "invalid argument for --log_format, got: iso"),
    ],
)
def test_http_refusals(server: ServerProcess, body: Any, status: int, error: str) -> None:
    got, _, answer = _post(server, body)
    assert (got, json.loads(answer)) == (status, {"error": error})
    assert json.loads(server.request("GET", "/v2/logging")[2]) == DEFAULTS  # nothing changed


def test_other_methods_are_405(server: ServerProcess) -> None:
    status, _, body = server.request("PUT", "/v2/logging", b"{}")
    assert status == 405, body
    assert json.loads(server.request("GET", "/v2/logging")[2]) == DEFAULTS  # nothing changed


def test_tritonclient_http(defaults: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(defaults.url)
    assert client.get_log_settings() == DEFAULTS
    changed = client.update_log_settings({"log_warning": False, "log_verbose_level": 3})
    assert changed == {**DEFAULTS, "log_warning": False, "log_verbose_level": 3}
    with pytest.raises(InferenceServerException, match="can not be updated"):
        client.update_log_settings({"log_file": "elsewhere.log"})
    client.close()


def test_tritonclient_grpc(defaults: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(defaults.grpc_url)
    answer = client.get_log_settings(as_json=True)
    assert answer["settings"]["log_verbose_level"] == {"uint32_param": 0}
    assert answer["settings"]["log_info"] == {"bool_param": True}
    assert answer["settings"]["log_file"] == {"string_param": ""}
    changed = client.update_log_settings({"log_format": "ISO8601", "log_error": False})
    settings = changed.settings
    assert settings["log_format"].string_param == "ISO8601"
    assert settings["log_error"].bool_param is False
    assert json.loads(defaults.request("GET", "/v2/logging")[2])["log_format"] == "ISO8601"
    client.close()


@pytest.mark.parametrize(
    ("settings", "code", "error"),
    [
        ({"log_file": "x.log"}, grpc.StatusCode.UNIMPLEMENTED,
         "log file location can not be updated through network protocol"),
        ({"log_info": 1}, grpc.StatusCode.INVALID_ARGUMENT, "expect boolean for 'log_info'"),
        ({"log_verbose_level": True}, grpc.StatusCode.INVALID_ARGUMENT,
         "expect int32 for 'log_verbose_level'"),
        ({"log_format": False}, grpc.StatusCode.INVALID_ARGUMENT,
         "expect string for 'log_format'"),
        ({"log_format": "iso"}, grpc.StatusCode.INVALID_ARGUMENT,
         "invalid argument for log_format, got: iso"),
    ],
)
def test_grpc_refusals(
    server: ServerProcess, settings: dict[str, Any], code: grpc.StatusCode, error: str
) -> None:
    request = pb.LogSettingsRequest()
    for key, value in settings.items():
        if isinstance(value, bool):
            request.settings[key].bool_param = value
        elif isinstance(value, int):
            request.settings[key].uint32_param = value
        else:
            request.settings[key].string_param = value
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.GRPCInferenceServiceStub(channel).LogSettings(request, timeout=10)
    assert (raised.value.code(), raised.value.details()) == (code, error)
    assert json.loads(server.request("GET", "/v2/logging")[2]) == DEFAULTS  # nothing changed



def test_restricted_logging_needs_its_header(tmp_path: Path) -> None:
    """``logging`` is a restricted-API category: refused without its header (HTTP 403, gRPC
    UNAVAILABLE), served with it."""
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "echo" / "1" / "model.onnx")
    process = start_server(
        tmp_path,
        args=(
            "--http-restricted-api=logging:log-key=secret",
            "--grpc-restricted-protocol=logging:log-key=secret",
        ),
    )
    try:
        assert process.port is not None, process.log
        status, _, body = process.request("GET", "/v2/logging")
        assert (status, json.loads(body)) == (
            403, {"error": "This API is restricted, expecting header 'log-key'"}
        )
        assert process.request("POST", "/v2/logging", b"{}", {"log-key": "wrong"})[0] == 403
        status, _, body = process.request("GET", "/v2/logging", None, {"log-key": "secret"})
        assert (status, json.loads(body)) == (200, DEFAULTS)
        client = grpcclient.InferenceServerClient(process.grpc_url)
        with pytest.raises(InferenceServerException) as raised:
            client.get_log_settings()
        assert raised.value.status() == "StatusCode.UNAVAILABLE"
        header = {"triton-grpc-protocol-log-key": "secret"}
        answer = client.get_log_settings(headers=header, as_json=True)
        assert answer["settings"]["log_format"] == {"string_param": "default"}
        client.close()
    finally:
        process.stop()


def test_a_restarted_front_end_gets_the_settings_as_they_are(tmp_path: Path) -> None:
    """A front end started again after its death logs with the changed settings, not its
    flags: the executor sends them when it connects."""
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "echo" / "1" / "model.onnx")
    process = start_server(tmp_path, args=("--frontends=1",))
    try:
        assert process.port is not None, process.log
        assert _post(process, {"log_verbose_level": 1, "log_format": "ISO8601"})[0] == 200
        old = int(re.findall(r"front end 0 \(pid (\d+)\) ready", process.log)[0])
        os.kill(old, signal.SIGKILL)
        process.wait_for_log(f"front end 0 (pid {old}) ended")
        deadline = time.monotonic() + 30
        while not (new := re.findall(r"front end 0 \(pid (\d+)\) ready", process.log)[1:]):
            assert time.monotonic() < deadline, process.log
            time.sleep(0.05)
        mark = len(process.lines)
        _infer(process, "after-restart")
        _lines_after(process, mark, "id='after-restart'")
        time.sleep(0.2)
        access = [line for line in process.lines[mark:] if f" {new[0]} tornado.access]" in line]
        assert access and all(_ISO_LINE.match(line) for line in access), process.lines[mark:]
    finally:
        process.stop()
