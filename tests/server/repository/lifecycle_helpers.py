"""Helpers shared by the model lifecycle integration tests (repository builders, waiting,
inference through tritonclient on both transports)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models

TRAVERSAL = "model name must not contain path traversal characters"
EMPTY_NAME = "Model name cannot be empty. Please enter a valid name to deploy."
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
NO_FOLDER = "failed to poll from model repository"

Client: TypeAlias = httpclient.InferenceServerClient | grpcclient.InferenceServerClient


def add_identity(root: Path, name: str, max_batch_size: int | None = None) -> Path:
    """FP32 identity ``[batch, 4]``; with ``max_batch_size`` a partial config.pbtxt too
    (the rest is auto-completed)."""
    make_models.save(make_models.identity("FP32", ["batch", 4]), root / name / "1" / "model.onnx")
    if max_batch_size is not None:
        make_models.write_text(f"max_batch_size: {max_batch_size}\n", root / name / "config.pbtxt")
    return root / name


def identity_repository(root: Path, names: Iterable[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        add_identity(root, name)
    return root


def add_sub_bytes() -> bytes:
    """An FP32 add/sub model ``[batch, 4]`` (two inputs, two outputs), serialized."""
    return make_models.add_sub("FP32", 4).SerializeToString(deterministic=True)


def identity_bytes() -> bytes:
    return make_models.identity("FP32", ["batch", 4]).SerializeToString(deterministic=True)


def identity_config(max_batch_size: int) -> str:
    """A complete JSON ModelConfig for the identity model (the load API's ``config``)."""
    return json.dumps(
        {
            "backend": "onnxruntime",
            "max_batch_size": max_batch_size,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )


def add_sub_config(max_batch_size: int = 8) -> str:
    tensor = {"data_type": "TYPE_FP32", "dims": [4]}
    return json.dumps(
        {
            "backend": "onnxruntime",
            "max_batch_size": max_batch_size,
            "input": [{"name": "INPUT0", **tensor}, {"name": "INPUT1", **tensor}],
            "output": [{"name": "OUTPUT0", **tensor}, {"name": "OUTPUT1", **tensor}],
        }
    )


def bump_mtimes(folder: Path) -> None:
    """Move every file's mtime 10 s forward, so a rewrite within one clock tick shows."""
    for path in folder.rglob("*"):
        if path.is_file():
            stat = path.stat()
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10_000_000_000))


def snapshot(*roots: Path) -> dict[str, str]:
    """Every path under ``roots`` with a digest of its contents (folders: "dir")."""
    found: dict[str, str] = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            key = str(path)
            if path.is_socket():  # the supervisor's control socket: no contents
                found[key] = "socket"
                continue
            found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``predicate()`` held; raises AssertionError after ``timeout``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def rows(batch: int, start: float = 0.0) -> np.ndarray:
    return (np.arange(batch * 4, dtype=np.float32) + start).reshape(batch, 4)


def infer_identity(client: Client, name: str, data: np.ndarray) -> np.ndarray:
    """Send ``data`` to an identity model through ``client`` (either transport)."""
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(name, [tensor])
    out: np.ndarray = result.as_numpy("OUTPUT0")
    return out


def infer_add_sub(client: Client, name: str, a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = []
    for input_name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(input_name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    result = client.infer(name, inputs)
    return {"OUTPUT0": result.as_numpy("OUTPUT0"), "OUTPUT1": result.as_numpy("OUTPUT1")}


def index_of(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in entries if entry["name"] == name]


def client_error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """The tritonclient error ``call(*args, **kwargs)`` raises (fails if it raises none)."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def assert_serves(client: Client, name: str = "keep") -> None:
    """``name`` (loaded if it is not) answers a good request: the server is still serving
    after whatever a test refused."""
    if not client.is_model_ready(name):
        client.load_model(name)
    data = rows(2, 7.0)
    np.testing.assert_array_equal(infer_identity(client, name, data), data)
