"""Explicit model control through NVIDIA's ``tritonclient.http`` (and raw HTTP where the client
has no call): ``--load-model``, load, unload, reload with a config override, file overrides in
a private folder, index with the ready filter, name and path checks, refusals in the other
modes, a corrupt model and strict readiness (triton-facts §1.2, §1.5, §2.2, §7.5)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.server.http.helpers import error_of
from tests.server.repository.lifecycle_helpers import (
    EMPTY_NAME,
    NO_FOLDER,
    NOT_ALLOWED,
    TRAVERSAL,
    add_identity,
    add_sub_bytes,
    add_sub_config,
    assert_serves,
    client_error,
    identity_bytes,
    identity_config,
    identity_repository,
    index_of,
    infer_add_sub,
    infer_identity,
    rows,
    snapshot,
    wait_until,
)
from tests.server_process import ServerProcess, start_server

EXPLICIT = "--model-control-mode=explicit"
OVERRIDE_PREFIX = "tensorgate-override-"


def _identity_body(batch: int, start: float = 0.0) -> bytes:
    data = rows(batch, start)
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [batch, 4],
                     "data": data.flatten().tolist()}]}
    ).encode()


def _identity_ok(server: ServerProcess, name: str, batch: int, start: float = 0.0) -> None:
    status, _, body = server.request("POST", f"/v2/models/{name}/infer", _identity_body(batch, start))
    assert status == 200, body
    (output,) = json.loads(body)["outputs"]
    assert output["data"] == rows(batch, start).flatten().tolist()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = identity_repository(
        tmp_path_factory.mktemp("lifecycle_http_repo"),
        ["first", "second", "cycle", "reload_me", "files_m", "keep"],
    )
    add_identity(root, "cfg", max_batch_size=8)
    add_identity(root, "recheck", max_batch_size=8)
    return root


@pytest.fixture(scope="module")
def server_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's TMPDIR: where its private override folders appear."""
    return tmp_path_factory.mktemp("lifecycle_http_server_tmp")


@pytest.fixture(scope="module")
def server(repo: Path, server_tmp: Path) -> Iterator[ServerProcess]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(server_tmp))
        process = start_server(repo, args=(EXPLICIT,))
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def still_serving(client: httpclient.InferenceServerClient) -> Iterator[None]:
    """After every test, refusals included: the untouched model still answers."""
    yield
    assert_serves(client)


def _override_folders(server_tmp: Path, model: str) -> list[Path]:
    return [p for p in server_tmp.glob(OVERRIDE_PREFIX + "*") if (p / model).is_dir()]


# ---- start-up --------------------------------------------------------------------------------


def test_load_model_flag_loads_only_those_models(repo: Path) -> None:
    server = start_server(repo, args=(EXPLICIT, "--load-model=first", "--load-model=second"))
    try:
        assert server.port is not None, server.log
        c = httpclient.InferenceServerClient(server.url)
        index = c.get_model_repository_index()
        names = sorted(p.name for p in repo.iterdir())
        assert [e["name"] for e in index] == names
        for entry in index:
            if entry["name"] in ("first", "second"):
                assert entry["version"] == "1" and entry["state"] == "READY", entry
            else:
                assert entry == {"name": entry["name"]}  # never loaded: name only
        assert c.is_model_ready("first") and c.is_model_ready("second", "1")
        assert not c.is_model_ready("cycle")
        assert c.is_server_ready()  # strict readiness counts the wanted models only
        np.testing.assert_array_equal(infer_identity(c, "first", rows(2)), rows(2))
        error = client_error(infer_identity, c, "cycle", rows(1))
        assert str(error.status()) == "400"
        assert "Request for unknown model: 'cycle' is not found" in error.message()
        c.close()
    finally:
        server.stop()


def test_load_model_star_loads_everything(repo: Path) -> None:
    server = start_server(repo, args=(EXPLICIT, "--load-model=*"))
    try:
        assert server.port is not None, server.log
        c = httpclient.InferenceServerClient(server.url)
        index = c.get_model_repository_index()
        assert {e["name"] for e in index} == {p.name for p in repo.iterdir()}
        assert all(e["state"] == "READY" for e in index), index
        c.close()
    finally:
        server.stop()


# ---- load, unload, index -------------------------------------------------------------------


def test_load_and_unload(client: httpclient.InferenceServerClient) -> None:
    assert not client.is_model_ready("cycle")
    assert index_of(client.get_model_repository_index(), "cycle") == [{"name": "cycle"}]

    client.load_model("cycle")
    assert client.is_model_ready("cycle") and client.is_model_ready("cycle", "1")
    (entry,) = index_of(client.get_model_repository_index(), "cycle")
    assert (entry["version"], entry["state"]) == ("1", "READY")
    np.testing.assert_array_equal(infer_identity(client, "cycle", rows(3, 7)), rows(3, 7))
    assert client.get_model_metadata("cycle")["versions"] == ["1"]

    client.unload_model("cycle")
    assert not client.is_model_ready("cycle")
    (entry,) = index_of(client.get_model_repository_index(), "cycle")
    assert (entry["version"], entry["state"]) == ("1", "UNAVAILABLE")
    error = client_error(infer_identity, client, "cycle", rows(1))
    assert (str(error.status()), error.message()) == (
        "404", "Request for unknown model: 'cycle' has no available versions"
    )

    client.unload_model("cycle")  # unloading an unloaded model is fine
    client.unload_model("never_there", unload_dependents=True)
    client.load_model("cycle")  # and it loads again
    np.testing.assert_array_equal(infer_identity(client, "cycle", rows(1)), rows(1))
    client.unload_model("cycle")


def test_index_ready_filter(server: ServerProcess, client: httpclient.InferenceServerClient) -> None:
    client.load_model("keep")
    full = client.get_model_repository_index()
    status, _, body = server.request("POST", "/v2/repository/index", b'{"ready": true}')
    assert status == 200, body
    ready = json.loads(body)
    assert ready == [e for e in full if e.get("state") == "READY"]
    assert index_of(ready, "keep") and all("version" in e for e in ready)
    assert not index_of(ready, "second")
    for body_text in (b"", b"{}", b'{"ready": false}'):
        status, _, body = server.request("POST", "/v2/repository/index", body_text)
        assert status == 200 and json.loads(body) == full
    response = server.request("POST", "/v2/repository/index", b'{"ready": "yes"}')
    assert response[0] == 400, response
    assert error_of(response) == "Invalid value for 'ready': expected a boolean"


# ---- overrides and reload ---------------------------------------------------------------------


def test_load_with_config_override_beats_config_pbtxt(
    repo: Path, client: httpclient.InferenceServerClient
) -> None:
    before = snapshot(repo)
    client.load_model("cfg", config=identity_config(3))
    assert client.get_model_config("cfg")["max_batch_size"] == 3
    np.testing.assert_array_equal(infer_identity(client, "cfg", rows(3)), rows(3))
    error = client_error(infer_identity, client, "cfg", rows(4))
    assert str(error.status()) == "400"
    # without an override the folder's config.pbtxt (max_batch_size 8) applies again
    client.load_model("cfg")
    assert client.get_model_config("cfg")["max_batch_size"] == 8
    assert snapshot(repo) == before


def test_a_repeated_request_is_checked_against_the_reloaded_config(
    client: httpclient.InferenceServerClient,
) -> None:
    """The same JSON header, sent again, is decoded once (``HeaderCache``) but checked against
    the config of the model as loaded now."""
    client.load_model("recheck", config=identity_config(3))
    for start in (0.0, 10.0):
        np.testing.assert_array_equal(
            infer_identity(client, "recheck", rows(3, start)), rows(3, start)
        )
    client.load_model("recheck", config=identity_config(2))
    error = client_error(infer_identity, client, "recheck", rows(3))
    assert str(error.status()) == "400"
    assert "batch-size must be <= 2" in str(error)
    client.load_model("recheck")
    np.testing.assert_array_equal(infer_identity(client, "recheck", rows(3, 5.0)), rows(3, 5.0))


def test_reload_with_changed_config_switches_without_failing_requests(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    client.load_model("reload_me")
    assert client.get_model_config("reload_me")["max_batch_size"] == 4  # auto-completed
    failures: list[str] = []
    sent = 0
    stop = threading.Event()

    def traffic() -> None:
        nonlocal sent
        while not stop.is_set():
            try:
                _identity_ok(server, "reload_me", 2, float(sent))
                status, _, body = server.request("GET", "/v2/models/reload_me/ready")
                if status != 200:
                    failures.append(f"not ready: {status} {body!r}")
            except (AssertionError, OSError) as exc:
                failures.append(repr(exc))
            sent += 1

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_until(lambda: sent >= 5, 10)
        client.load_model("reload_me", config=identity_config(2))
        assert client.get_model_config("reload_me")["max_batch_size"] == 2
        mark = sent
        wait_until(lambda: sent >= mark + 5, 10)
        client.load_model("reload_me", config=identity_config(8))
        mark = sent
        wait_until(lambda: sent >= mark + 5, 10)
    finally:
        stop.set()
        thread.join(30)
    assert failures == []
    assert client.get_model_config("reload_me")["max_batch_size"] == 8
    np.testing.assert_array_equal(infer_identity(client, "reload_me", rows(8)), rows(8))
    assert str(client_error(infer_identity, client, "reload_me", rows(9)).status()) == "400"


def test_load_with_file_override_serves_it_and_leaves_the_repository_alone(
    repo: Path, server_tmp: Path, client: httpclient.InferenceServerClient
) -> None:
    before = snapshot(repo)
    model = add_sub_bytes()
    a, b = rows(2), np.full((2, 4), 3, np.float32)
    # a model in the repository, replaced by the files (identity -> add/sub)
    client.load_model("files_m", config=add_sub_config(), files={"file:1/model.onnx": model})
    out = infer_add_sub(client, "files_m", a, b)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    (folder,) = _override_folders(server_tmp, "files_m")
    assert (folder / "files_m" / "1" / "model.onnx").read_bytes() == model
    # a model that exists only as files
    client.load_model("only_files", config=add_sub_config(), files={"file:1/model.onnx": model})
    assert client.is_model_ready("only_files")
    np.testing.assert_array_equal(infer_add_sub(client, "only_files", a, b)["OUTPUT0"], a + b)
    assert len(_override_folders(server_tmp, "only_files")) == 1
    assert snapshot(repo) == before  # nothing was written into the user's repository

    client.unload_model("only_files")
    assert _override_folders(server_tmp, "only_files") == []
    client.load_model("files_m")  # back to the repository's identity: the folder goes
    assert _override_folders(server_tmp, "files_m") == []
    np.testing.assert_array_equal(infer_identity(client, "files_m", rows(1)), rows(1))
    client.unload_model("files_m")
    assert snapshot(repo) == before


@pytest.mark.parametrize("key", ["file:../x", "file:/abs", "file:1/../../x"])
def test_file_override_paths_that_escape_are_refused(
    repo: Path, server_tmp: Path, client: httpclient.InferenceServerClient, key: str
) -> None:
    client.load_model("keep")
    base = server_tmp.parent
    before = snapshot(base, repo)
    error = client_error(
        client.load_model, "keep", config=identity_config(4),
        files={key: b"evil", "file:1/model.onnx": b"also not used"},
    )
    assert str(error.status()) == "400"
    assert "invalid file override path" in error.message()
    assert snapshot(base, repo) == before
    assert not Path("/abs").exists()
    assert client.is_model_ready("keep")  # the serving model is untouched
    np.testing.assert_array_equal(infer_identity(client, "keep", rows(1)), rows(1))


def test_load_request_body_errors(server: ServerProcess) -> None:
    """Each refused load names its cause and leaves the serving model alone."""
    status, _, text = server.request("POST", "/v2/repository/models/keep/load")
    assert status == 200, text
    for body, cause in (
        (
            b'{"parameters":{"config":"{}","file:1/model.onnx":"!!not base64"}}',
            "Unable to parse 'file:1/model.onnx': invalid base64",
        ),
        (
            b'{"parameters":{"config":{"max_batch_size":1}}}',
            "Unable to parse 'config': expected a JSON string",
        ),
        (
            b'{"parameters":{"config":"{not json"}}',
            "failed to load 'keep': failed to parse JSON model config: ",
        ),
        (  # what NVIDIA's simple_http_model_control.py sends, and matches "failed to load" in
            b'{"parameters":{"config":"\\"parameters\\": {\\"config\\": {{}}}"}}',
            "failed to load 'keep': failed to parse JSON model config: ",
        ),
        (
            b'{"parameters":{"file:1/model.onnx":"AAAA"}}',
            "Load parameter 'config' must be specified for model file override",
        ),
        (
            b'{"parameters":{"config":"{}","file:1/' + b"a" * 300 + b'":"AAAA"}}',
            "invalid file override path '1/aaaa",
        ),
        (b"[1, 2]", "the model load request must be a JSON object"),
    ):
        response = server.request("POST", "/v2/repository/models/keep/load", body)
        assert response[0] == 400, (body, response)
        assert error_of(response).startswith(cause), body
        assert server.request("GET", "/v2/models/keep/ready")[0] == 200, body
        _identity_ok(server, "keep", 2, 5.0)


# ---- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "quoted, message",
    [
        ("..%2Fetc", TRAVERSAL),
        ("a%2F..%2Fb", TRAVERSAL),
        ("%2Fetc%2Fpasswd", TRAVERSAL),
        ("%20..", TRAVERSAL),
        ("..", TRAVERSAL),
        ("%20", EMPTY_NAME),
        ("%09", EMPTY_NAME),
        ("model..1", f"failed to load 'model..1', {NO_FOLDER}"),
        ("..my_model", f"failed to load '..my_model', {NO_FOLDER}"),
    ],
)
def test_model_names_over_http(server: ServerProcess, quoted: str, message: str) -> None:
    status, _, body = server.request("POST", f"/v2/repository/models/{quoted}/load")
    assert status == 400, body
    assert json.loads(body)["error"] == message


# ---- other modes -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_refused_outside_explicit_mode(tmp_path: Path, mode: str) -> None:
    repo = identity_repository(tmp_path / "repo", ["m"])
    server = start_server(repo, args=(f"--model-control-mode={mode}",))
    try:
        assert server.port is not None, server.log
        c = httpclient.InferenceServerClient(server.url)
        for call in (c.load_model, c.unload_model):
            error = client_error(call, "m")
            assert (str(error.status()), error.message()) == ("503", NOT_ALLOWED)
        error = client_error(c.load_model, "m", config=identity_config(1))
        assert str(error.status()) == "503"
        g = grpcclient.InferenceServerClient(server.grpc_url)
        for call in (g.load_model, g.unload_model):
            error = client_error(call, "m")
            assert (error.status(), error.message()) == ("StatusCode.UNAVAILABLE", NOT_ALLOWED)
        assert c.is_model_ready("m")  # the refused unload did nothing
        np.testing.assert_array_equal(infer_identity(c, "m", rows(1)), rows(1))
        c.close()
        g.close()
    finally:
        server.stop()


# ---- failures and readiness --------------------------------------------------------------------


def test_corrupt_model_load_fails_and_the_server_keeps_serving(tmp_path: Path) -> None:
    repo = identity_repository(tmp_path / "repo", ["good"])
    (repo / "corrupt" / "1").mkdir(parents=True)
    (repo / "corrupt" / "1" / "model.onnx").write_bytes(b"\x08\x01garbage, not a model")
    server = start_server(repo, args=(EXPLICIT, "--load-model=good"))
    try:
        assert server.port is not None, server.log
        c = httpclient.InferenceServerClient(server.url)
        assert c.is_server_ready()
        error = client_error(c.load_model, "corrupt")
        assert str(error.status()) == "400"
        assert error.message().startswith(
            "failed to load 'corrupt': unable to load model 'corrupt': "
        ), error.message()
        assert "INVALID_PROTOBUF" in error.message()
        assert c.is_server_live()
        np.testing.assert_array_equal(infer_identity(c, "good", rows(2)), rows(2))
        (entry,) = index_of(c.get_model_repository_index(), "corrupt")
        assert entry["state"] == "UNAVAILABLE"
        assert entry["reason"] and entry["reason"] in error.message()
        assert not c.is_model_ready("corrupt")
        # strict readiness: a model that should be loaded is not READY
        assert not c.is_server_ready()
        assert server.request("GET", "/v2/health/ready")[0] == 400
        c.unload_model("corrupt")
        assert c.is_server_ready()

        # a failed reload (bad files) keeps the serving version
        error = client_error(
            c.load_model, "good", config=identity_config(4),
            files={"file:1/model.onnx": b"not onnx either"},
        )
        assert str(error.status()) == "400"
        assert error.message().startswith(
            "failed to load 'good': version 1: unable to load model 'good': "
        ), error.message()
        assert "INVALID_PROTOBUF" in error.message()
        assert c.is_model_ready("good") and c.is_server_ready()
        (entry,) = index_of(c.get_model_repository_index(), "good")
        assert entry["state"] == "READY"
        np.testing.assert_array_equal(infer_identity(c, "good", rows(4)), rows(4))
        c.close()
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log


# ---- hostile config overrides ------------------------------------------------------------------


def _load_with(server: ServerProcess, name: str, config: dict[str, object]) -> tuple[int, str]:
    body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
    response = server.request("POST", f"/v2/repository/models/{name}/load", body)
    return response[0], error_of(response) if response[0] != 200 else ""


@pytest.mark.parametrize(
    "filename", ["../cfg/1/model.onnx", "../../lifecycle_secret.onnx", "{abs}"]
)
def test_override_naming_a_model_file_outside_its_folder_is_refused(
    server: ServerProcess, repo: Path, client: httpclient.InferenceServerClient, filename: str
) -> None:
    """Item: a config override may not make the server read a file outside the model's
    version folder, however the name is written."""
    secret = repo.parent / "lifecycle_secret.onnx"
    secret.write_bytes(identity_bytes())
    client.load_model("keep")
    config = {
        **json.loads(identity_config(4)),
        "default_model_filename": filename.format(abs=secret),
    }
    status, message = _load_with(server, "keep", config)
    assert status == 400, message
    assert message.startswith("failed to load 'keep': "), message
    assert "model file" in message and "the model's version folder" in message, message
    assert str(repo) not in message and str(repo.parent) not in message
    assert_serves(client)  # the serving version stays


def test_absurd_override_counts_are_refused_at_once_and_memory_stays(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    client.load_model("keep")
    rss_before = server.resident_bytes()
    base = json.loads(identity_config(4))
    for extra, field in (
        ({"instance_group": [{"kind": "KIND_CPU", "count": 100_000}]}, "instance_group[0].count"),
        ({"dynamic_batching": {"priority_levels": 10**9}}, "dynamic_batching.priority_levels"),
        (
            {"input": [
                {"name": f"I{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in range(100_000)
            ]},
            "'input' has 100000 entries",
        ),
    ):
        started = time.monotonic()
        status, message = _load_with(server, "keep", {**base, **extra})
        assert time.monotonic() - started < 10, field
        assert status == 400 and field in message, message
        assert_serves(client)
    growth = server.resident_bytes() - rss_before
    assert growth < 200 << 20, growth


def test_a_huge_override_does_not_stall_other_requests(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    """The config's JSON is parsed off the event loop: while a 100,000-input override is
    parsed and refused, requests on other connections are answered."""
    client.load_model("keep")
    config = {
        **json.loads(identity_config(4)),
        "input": [{"name": f"I{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in range(100_000)],
    }
    outcome: list[tuple[int, str]] = []
    loader = threading.Thread(target=lambda: outcome.append(_load_with(server, "keep", config)))
    loader.start()
    slowest = 0.0
    while loader.is_alive():
        started = time.monotonic()
        _identity_ok(server, "keep", 1)
        slowest = max(slowest, time.monotonic() - started)
    loader.join()
    assert outcome[0][0] == 400, outcome
    assert slowest < 1.0, slowest
