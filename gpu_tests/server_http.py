"""Helpers shared by the gpu_tests that talk to a real server over HTTP.

``test_server_gpu_path.py`` and ``test_cuda_shm_server.py`` both write python-backend models
that compute ``y = 2 * x + 1`` on a KIND_GPU and a KIND_CPU instance, start ``python -m server``
on them, and send binary-data inference requests; the model repository, the start-up, the
requests and the parsing of binary answers live here once. Not a test module: no ``test_``
prefix, and nothing here imports CuPy (the models it writes do, inside the server).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from tests.server_process import ServerProcess, start_server

TIMEOUT_S = 60.0
DTYPES = {"FP32": np.dtype(np.float32), "INT32": np.dtype(np.int32)}

GPU_GROUP = "kind: KIND_GPU count: 1 gpus: [ 0 ]"
CPU_GROUP = "kind: KIND_CPU count: 1"
# A non-batching model: FP32 INPUT0 [-1] -> FP32 OUTPUT0 [-1]; ``format`` it with the model's
# name and one of the groups above.
VECTOR_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ {group} }} ]
"""
AFFINE = "x * x.dtype.type(2) + x.dtype.type(1)"  # y = 2x + 1, in the dtype of x
_CHECKED_MODEL = Template('''import $xp


class TensorgateModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        assert isinstance(x, $xp.ndarray), type(x)
        return {"OUTPUT0": $output}
''')


def checked_model(xp: str, output: str) -> str:
    """The code of a python model whose INPUT0, ``x``, must be an array of module ``xp``
    (``"cupy"`` on a KIND_GPU instance, ``"numpy"`` on a KIND_CPU one) and whose OUTPUT0 is
    the expression ``output`` of ``x``."""
    return _CHECKED_MODEL.substitute(xp=xp, output=output)


def affine(x: np.ndarray) -> np.ndarray:
    """What the affine models answer: ``2 * x + 1`` in FP32."""
    return x * np.float32(2) + np.float32(1)


def write_model(root: Path, name: str, config: str, code: str) -> None:
    """Model ``name`` of the repository ``root``: its ``config.pbtxt`` and ``1/model.py``."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(code)


@contextmanager
def serving(root: Path, models: Iterable[str], *flags: str) -> Iterator[ServerProcess]:
    """The server on the repository ``root`` with ``flags`` (HTTP only), once every one of
    ``models`` is ready; stopped on leaving."""
    process = start_server(
        root, args=(*flags, "--allow-grpc=false", "--allow-metrics=false"), timeout=120.0
    )
    try:
        assert process.port is not None, process.log
        for model in models:
            status, _, body = request(process, "GET", f"/v2/models/{model}/ready")
            assert status == 200, (model, body, process.log[-4000:])
        yield process
    finally:
        process.stop()


def assert_serving(server: ServerProcess) -> None:
    """The server process is alive and ready."""
    assert server.proc.poll() is None, server.log[-4000:]
    status, _, body = request(server, "GET", "/v2/health/ready")
    assert status == 200, (body, server.log[-4000:])


def connect(server: ServerProcess) -> http.client.HTTPConnection:
    """A new (not yet connected) connection to the server's HTTP port on 127.0.0.1."""
    return http.client.HTTPConnection("127.0.0.1", server.port or 0, timeout=TIMEOUT_S)


def request(
    server: ServerProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, str | None, bytes]:
    """(status, Inference-Header-Content-Length or None, body) of one request to 127.0.0.1,
    on ``connection`` if given (the caller closes it), else on a fresh one."""
    assert server.port is not None, server.log
    conn = connection or connect(server)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, response.getheader("Inference-Header-Content-Length"), data
    finally:
        if connection is None:
            conn.close()


def post_infer(
    server: ServerProcess,
    model: str,
    shape: list[int],
    input_parameters: dict[str, Any],
    outputs: Mapping[str, dict[str, Any]],
    binary_input: np.ndarray | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, str | None, bytes]:
    """One inference request: FP32 INPUT0 of ``shape`` with ``input_parameters``, and the
    ``outputs`` asked for, by name, each with its parameters. With ``binary_input``, INPUT0's
    bytes follow the JSON header (binary data); else the body is the JSON alone."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": shape,
                    "datatype": "FP32",
                    "parameters": input_parameters,
                }
            ],
            "outputs": [
                {"name": name, "parameters": parameters} for name, parameters in outputs.items()
            ],
        }
    ).encode()
    if binary_input is None:
        body, headers = header, {"Content-Type": "application/json"}
    else:
        body = header + np.ascontiguousarray(binary_input, dtype=np.float32).tobytes()
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
    return request(server, "POST", f"/v2/models/{model}/infer", body, headers, connection)


def binary_outputs(header_length: str | None, body: bytes) -> dict[str, np.ndarray]:
    """The outputs of a binary-data response, by name (each a copy); every byte of the body
    is the header or an output's."""
    assert header_length is not None, body[:500]
    split = int(header_length)
    header: dict[str, Any] = json.loads(body[:split])
    offset = split
    outputs: dict[str, np.ndarray] = {}
    for output in header["outputs"]:
        assert "data" not in output, output
        size = int(output["parameters"]["binary_data_size"])
        dtype = DTYPES[output["datatype"]]
        blob = body[offset : offset + size]
        assert len(blob) == size, (output, len(body))
        outputs[output["name"]] = np.frombuffer(blob, dtype).reshape(output["shape"]).copy()
        offset += size
    assert offset == len(body), (offset, len(body))
    return outputs
