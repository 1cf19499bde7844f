"""Explicit model control through NVIDIA's ``tritonclient.grpc`` (and the raw stub for the
index's ready filter): ``--load-model``, load, unload, reload with a config override, file
overrides as bytes, Triton's model name checks (``qa/L0_input_validation``,
triton-facts §7.5) and a corrupt model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.server.repository.lifecycle_helpers import (
    EMPTY_NAME,
    NO_FOLDER,
    TRAVERSAL,
    add_identity,
    add_sub_bytes,
    add_sub_config,
    assert_serves,
    client_error,
    identity_config,
    identity_repository,
    infer_add_sub,
    infer_identity,
    rows,
    snapshot,
)
from tests.server_process import ServerProcess, start_server

EXPLICIT = "--model-control-mode=explicit"
INVALID = "StatusCode.INVALID_ARGUMENT"


def _index(client: grpcclient.InferenceServerClient) -> list[dict[str, Any]]:
    models: list[dict[str, Any]] = client.get_model_repository_index(as_json=True).get(
        "models", []
    )
    return models


def _entry(client: grpcclient.InferenceServerClient, name: str) -> dict[str, Any]:
    (entry,) = [e for e in _index(client) if e["name"] == name]
    return entry


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = identity_repository(
        tmp_path_factory.mktemp("lifecycle_grpc_repo"),
        ["first", "second", "cycle", "reload_me", "files_m", "keep"],
    )
    add_identity(root, "cfg", max_batch_size=8)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    process = start_server(repo, args=(EXPLICIT,))
    assert process.grpc_port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def still_serving(client: grpcclient.InferenceServerClient) -> Iterator[None]:
    """After every test, refusals included: the untouched model still answers."""
    yield
    assert_serves(client)


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def test_load_model_flag_loads_only_that_model(repo: Path) -> None:
    server = start_server(repo, args=(EXPLICIT, "--load-model=first"))
    try:
        assert server.grpc_port is not None, server.log
        c = grpcclient.InferenceServerClient(server.grpc_url)
        index = c.get_model_repository_index()  # the protobuf message
        names = sorted(p.name for p in repo.iterdir())
        assert [m.name for m in index.models] == names
        for model in index.models:
            if model.name == "first":
                assert (model.version, model.state) == ("1", "READY")
            else:
                assert (model.version, model.state, model.reason) == ("", "", "")
        assert c.is_model_ready("first") and not c.is_model_ready("second")
        assert c.is_server_ready()
        error = client_error(infer_identity, c, "second", rows(1))
        assert error.status() == INVALID
        assert "Request for unknown model: 'second' is not found" in error.message()
        c.close()
    finally:
        server.stop()


def test_load_unload_and_ready_filter(
    client: grpcclient.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    assert not client.is_model_ready("cycle")
    assert _entry(client, "cycle") == {"name": "cycle"}
    client.load_model("cycle")
    assert client.is_model_ready("cycle") and client.is_model_ready("cycle", "1")
    entry = _entry(client, "cycle")
    assert (entry["version"], entry["state"]) == ("1", "READY")
    np.testing.assert_array_equal(infer_identity(client, "cycle", rows(2, 5)), rows(2, 5))

    ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    assert "cycle" in [m.name for m in ready.models]
    assert all(m.state == "READY" and m.version for m in ready.models)
    everything = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest())
    assert {m.name for m in everything.models} >= {m.name for m in ready.models} | {"second"}

    client.unload_model("cycle")
    assert not client.is_model_ready("cycle")
    entry = _entry(client, "cycle")
    assert (entry["version"], entry["state"]) == ("1", "UNAVAILABLE")
    ready = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    assert "cycle" not in [m.name for m in ready.models]
    error = client_error(infer_identity, client, "cycle", rows(1))
    assert error.status() in (INVALID, "StatusCode.NOT_FOUND", "StatusCode.UNAVAILABLE")
    client.unload_model("cycle", unload_dependents=True)  # again: fine
    client.load_model("cycle")
    np.testing.assert_array_equal(infer_identity(client, "cycle", rows(1)), rows(1))
    client.unload_model("cycle")


def test_reload_with_config_override(client: grpcclient.InferenceServerClient, repo: Path) -> None:
    before = snapshot(repo)
    client.load_model("reload_me")
    assert client.get_model_config("reload_me").config.max_batch_size == 4
    client.load_model("reload_me", config=identity_config(2))
    assert client.get_model_config("reload_me").config.max_batch_size == 2
    np.testing.assert_array_equal(infer_identity(client, "reload_me", rows(2)), rows(2))
    assert client_error(infer_identity, client, "reload_me", rows(3)).status() == INVALID
    # config.pbtxt (max_batch_size 8) loses to the override, and applies without one
    client.load_model("cfg", config=identity_config(1))
    assert client.get_model_config("cfg").config.max_batch_size == 1
    client.load_model("cfg")
    assert client.get_model_config("cfg").config.max_batch_size == 8
    assert snapshot(repo) == before


def test_load_with_file_override(client: grpcclient.InferenceServerClient, repo: Path) -> None:
    before = snapshot(repo)
    a, b = rows(3), np.full((3, 4), 2, np.float32)
    client.load_model("files_m", config=add_sub_config(), files={"file:1/model.onnx": add_sub_bytes()})
    out = infer_add_sub(client, "files_m", a, b)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    np.testing.assert_array_equal(out["OUTPUT1"], a - b)
    client.load_model("grpc_only", config=add_sub_config(), files={"file:1/model.onnx": add_sub_bytes()})
    assert client.is_model_ready("grpc_only")
    assert snapshot(repo) == before
    client.unload_model("grpc_only")
    client.load_model("files_m")
    np.testing.assert_array_equal(infer_identity(client, "files_m", rows(1)), rows(1))
    assert snapshot(repo) == before


@pytest.mark.parametrize("key", ["file:../x", "file:/abs", "file:1/../../x"])
def test_file_override_paths_that_escape_are_refused(
    client: grpcclient.InferenceServerClient, repo: Path, tmp_path: Path, key: str
) -> None:
    client.load_model("keep")
    before = snapshot(repo)
    error = client_error(client.load_model, "keep", config=identity_config(4), files={key: b"x"})
    assert error.status() == INVALID
    assert "invalid file override path" in error.message()
    assert snapshot(repo) == before
    assert client.is_model_ready("keep")


@pytest.mark.parametrize(
    "override, cause",
    [
        ({"default_model_filename": "../cfg/1/model.onnx"}, "resolves outside"),
        ({"instance_group": [{"kind": "KIND_CPU", "count": 100_000}]}, "instance_group[0].count"),
        (
            {"sequence_batching": {"control_input": [
                {"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}
            ]}},
            "sequence batching must specify either 'int32_false_true'",
        ),
    ],
)
def test_hostile_config_overrides_are_invalid_arguments(
    client: grpcclient.InferenceServerClient, override: dict[str, Any], cause: str
) -> None:
    """The load API refuses them over gRPC too, with INVALID_ARGUMENT and the reason."""
    client.load_model("keep")
    config = {**json.loads(identity_config(4)), **override}
    error = client_error(client.load_model, "keep", config=json.dumps(config))
    assert error.status() == INVALID
    assert error.message().startswith("failed to load 'keep': ") and cause in error.message()
    assert client.is_model_ready("keep")


def test_file_overrides_need_a_config(client: grpcclient.InferenceServerClient) -> None:
    error = client_error(client.load_model, "keep", files={"file:1/model.onnx": b"x"})
    assert (error.status(), error.message()) == (
        INVALID, "Load parameter 'config' must be specified for model file override"
    )


@pytest.mark.parametrize("name", ["../etc", "a/../b", "/etc/passwd", "model/", " ..", "..\\x"])
def test_traversal_names_are_refused(client: grpcclient.InferenceServerClient, name: str) -> None:
    error = client_error(client.load_model, name)
    assert (error.status(), error.message()) == (INVALID, TRAVERSAL)
    error = client_error(client.load_model, name, config=identity_config(1),
                   files={"file:1/model.onnx": add_sub_bytes()})
    assert error.message() == TRAVERSAL


@pytest.mark.parametrize("name", ["", " ", "\t", "  \t "])
def test_empty_names_are_refused(client: grpcclient.InferenceServerClient, name: str) -> None:
    error = client_error(client.load_model, name)
    assert (error.status(), error.message()) == (INVALID, EMPTY_NAME)


@pytest.mark.parametrize("name", ["model.version1", "...", "..my_model", "model..1"])
def test_odd_valid_names_are_not_traversal(
    client: grpcclient.InferenceServerClient, name: str
) -> None:
    error = client_error(client.load_model, name)
    assert NO_FOLDER in error.message()
    assert TRAVERSAL not in error.message()


@pytest.mark.parametrize("name", ["../etc", "a/../b", "/etc/passwd", "model/", " .."])
def test_unload_with_traversal_names_is_not_a_traversal_error(
    client: grpcclient.InferenceServerClient, name: str
) -> None:
    """As ``test_model_name_invalid_unload``: unloading a model that is not loaded succeeds,
    whatever its name; no traversal error, nothing else either."""
    client.unload_model(name)


def test_corrupt_model_load_fails_and_the_server_keeps_serving(tmp_path: Path) -> None:
    repo = identity_repository(tmp_path / "repo", ["good"])
    (repo / "corrupt" / "1").mkdir(parents=True)
    (repo / "corrupt" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    server = start_server(repo, args=(EXPLICIT, "--load-model=good"))
    try:
        assert server.grpc_port is not None, server.log
        c = grpcclient.InferenceServerClient(server.grpc_url)
        error = client_error(c.load_model, "corrupt")
        assert "corrupt" in error.message()
        assert c.is_server_live()
        np.testing.assert_array_equal(infer_identity(c, "good", rows(2)), rows(2))
        entry = _entry(c, "corrupt")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"]
        assert not c.is_server_ready()
        c.unload_model("corrupt")
        assert c.is_server_ready()
        c.close()
    finally:
        server.stop()
