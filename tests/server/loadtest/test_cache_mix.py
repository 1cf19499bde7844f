"""``tensorgate-bench --cache-hit-ratio``: the fixed request and fresh ones in the given
proportion, each fresh one new (a counter in an input, in the input's value range), found in
both encodings; and against a real server with the response cache, the hits counted there are
the fixed requests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from scripts import make_models
from server.loadtest import cache_mix
from server.loadtest.encoding import grpc_infer_request, http_infer_request
from server.loadtest.errors import UsageError
from server.loadtest.inputs import Tensor
from server.protocol import datatypes
from tests.server_process import ROOT, start_server


def _tensor(name: str, datatype: str, array: np.ndarray) -> Tensor:
    return Tensor(name, datatypes.from_name(datatype), array)


def _http(tensors: Sequence[Tensor]) -> bytes:
    return http_infer_request("h:1", "m", "", tensors, ["OUTPUT0"], True)


def _grpc(tensors: Sequence[Tensor]) -> bytes:
    return grpc_infer_request("m", "", tensors)


@pytest.mark.parametrize("encode", [_http, _grpc])
@pytest.mark.parametrize("datatype", ["FP32", "INT64", "UINT8"])
def test_fresh_requests_differ_only_in_the_counter(encode: object, datatype: str) -> None:
    assert callable(encode)
    values = np.arange(12).reshape(3, 4) % 64
    tensors = [
        _tensor("TEXT", "BYTES", np.array([[b"ab"]], dtype=object)),
        _tensor("INPUT0", datatype, values.astype(datatypes.from_name(datatype).dtype)),
    ]
    fixed = encode(tensors)
    mix = cache_mix.plan(0.75, tensors, encode)
    stream = cache_mix.RequestStream(fixed, mix)
    sent = [stream.next() for _ in range(400)]
    assert sum(r == fixed for r in sent) == 300  # exactly the ratio
    fresh = [r for r in sent if r != fixed]
    assert len(set(fresh)) == 100 and {len(r) for r in fresh} == {len(fixed)}
    itemsize = tensors[1].array.itemsize
    for request in fresh[:5]:
        head = bytes(b for i, b in enumerate(request) if not mix.offset <= i < mix.offset
                     + mix.digits * itemsize)
        assert head == bytes(b for i, b in enumerate(fixed) if not mix.offset <= i < mix.offset
                             + mix.digits * itemsize)
        patched = np.frombuffer(request, tensors[1].array.dtype, mix.digits, mix.offset)
        assert ((patched >= 0) & (patched < (1 if datatype == "FP32" else 64))).all()


def test_inputs_that_cannot_carry_a_counter_are_refused() -> None:
    tensors = [_tensor("FLAG", "BOOL", np.array([[True]]))]
    with pytest.raises(UsageError, match="needs an integer, FP32 or FP64 input"):
        cache_mix.plan(0.5, tensors, _http)


def test_a_sweep_hits_the_cache_in_the_given_proportion(tmp_path: Path) -> None:
    make_models.save(make_models.identity("FP32", ["batch", 8]), tmp_path / "echo" / "1" /
                     "model.onnx")
    config = make_models.config_pbtxt("echo", 8, [("INPUT0", "FP32", [8])],
                                      [("OUTPUT0", "FP32", [8])])
    make_models.write_text(config + "response_cache { enable: true }\n",
                           tmp_path / "echo" / "config.pbtxt")
    server = start_server(tmp_path, args=("--cache-config=local,size=1048576",))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "server.loadtest", "-u", server.url, "-m", "echo",
             "--concurrency", "1", "--workers", "1", "--warmup-seconds", "0",
             "--measurement-seconds", "30", "--max-requests", "50", "--no-progress",
             "--cache-hit-ratio", "0.8"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "80% of requests repeat one input set, the rest new" in result.stdout
        with httpclient.InferenceServerClient(server.url) as client:
            stats = client.get_inference_statistics("echo")
    finally:
        server.stop()
    inference = stats["model_stats"][0]["inference_stats"]
    sent = int(inference["success"]["count"]) - 1  # the probe: the fixed request's miss
    hits = int(inference["cache_hit"]["count"])
    assert sent >= 50 and hits == int(sent * 0.8)
    assert int(inference["cache_miss"]["count"]) == sent - hits + 1
