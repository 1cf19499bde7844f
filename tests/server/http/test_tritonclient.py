"""NVIDIA's ``tritonclient.http`` against the real server: health, metadata, config, and
inference in binary and JSON for every V2 datatype (triton-facts §0, §2.2, §2.3)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import (
    InferenceServerException,
    triton_to_np_dtype,
)

from tests.model_repos import DATATYPES, identity_name
from tests.server_process import ServerProcess
from tests.triton_texts import BATCH_NOTE, NO_ID

# After every test, the refusals included: a good request is still answered.
pytestmark = pytest.mark.usefixtures("assert_still_serving")

#: Datatypes ``InferInput.set_data_from_numpy(binary_data=False)`` refuses client-side.
CLIENT_REFUSES_JSON_INPUT = {"BF16"}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    c = httpclient.InferenceServerClient(server.url, concurrency=4)
    yield c
    c.close()


def _values(datatype: str, json_safe: bool) -> np.ndarray:
    """A [2, 3] tensor (batch 2) of ``datatype`` with the type's extreme values.

    ``json_safe`` leaves out what JSON numbers cannot carry (NaN, infinities, -0.0).
    """
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        items: list[Any] = [b"plain", "h\u00e9llo \u2603 \U0001f600".encode(), b""]
        items += [b'tab\tquote"back\\slash', b"x" * 300, "\u00fc".encode()]
        return np.array(items, dtype=object).reshape(2, 3)
    if datatype == "BF16":
        values = [1.5, -2.0, 0.0, 3.0e38, -1.0e-38, 256.0]
        if not json_safe:
            values[2] = float("inf")
        return np.array(values, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(
            [info.min, info.max, 0, 1, info.max - 1, info.min // 2 + 7], dtype=dtype
        ).reshape(2, 3)
    finfo = np.finfo(dtype)
    values = [finfo.max, finfo.min, finfo.tiny, finfo.smallest_subnormal, -0.5, 1 / 3]
    array = np.array(values, dtype=dtype)
    if not json_safe:
        array = np.concatenate([array[:3], np.array([np.inf, -np.inf, -0.0], dtype=dtype)])
    return array.reshape(2, 3)


def _assert_identical(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype == object:
        assert got.dtype == object
        assert list(got.reshape(-1)) == list(expected.reshape(-1))
        return
    assert got.dtype == expected.dtype
    # Byte-wise: distinguishes -0.0 from 0.0 and keeps infinities exact.
    assert got.tobytes() == expected.tobytes()


def _identity(
    client: httpclient.InferenceServerClient,
    datatype: str,
    data: np.ndarray,
    binary_in: bool,
    binary_out: bool,
) -> httpclient.InferResult:
    inp = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    return client.infer(identity_name(datatype), [inp], outputs=[out])


def _simple_inputs(
    a: np.ndarray, b: np.ndarray, binary: bool = True
) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
        httpclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


# --- health, metadata, config ------------------------------------------------------------


def test_server_live_and_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


def test_model_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("identity_fp32") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("no_such_model") is False


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"
    assert isinstance(meta["version"], str) and meta["version"]
    assert isinstance(meta["extensions"], list)
    for extension in ("binary_tensor_data", "model_configuration"):
        assert extension in meta["extensions"]


def test_model_metadata(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple")
    assert meta == {
        "name": "simple",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }
    assert client.get_model_metadata("simple", "1")["versions"] == ["1"]


def test_model_metadata_autocompleted_and_nonbatching(
    client: httpclient.InferenceServerClient,
) -> None:
    meta = client.get_model_metadata("dt_bytes")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1, -1]}]
    # max_batch_size 0: no leading -1.
    meta = client.get_model_metadata("nobatch_fp32")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [8]}]


def test_model_config_explicit(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT32", [16]),
        ("INPUT1", "TYPE_INT32", [16]),
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_INT32", [16]),
        ("OUTPUT1", "TYPE_INT32", [16]),
    ]
    assert "dynamic_batching" not in config  # simple's config.pbtxt has no scheduler block
    groups = config["instance_group"]
    assert len(groups) == 1
    assert groups[0]["kind"] == "KIND_CPU"
    assert groups[0]["count"] == 2
    assert config == client.get_model_config("simple", "1")


def test_model_config_autocompleted(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("identity_fp32")
    assert config["max_batch_size"] == 4
    assert config["platform"] == "onnxruntime_onnx"
    assert config["input"][0]["dims"] == [-1]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["output"][0]["dims"] == [-1]
    assert isinstance(config["dynamic_batching"], dict)
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 2
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_model_config_nonbatching(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("nobatch_fp32")
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [8]
    assert "dynamic_batching" not in config


# --- inference on every datatype -----------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_binary_every_datatype(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = _values(datatype, json_safe=False)
    result = _identity(client, datatype, data, binary_in=True, binary_out=True)
    output = result.get_output("OUTPUT0")
    assert output["datatype"] == datatype
    assert output["shape"] == [2, 3]
    assert "data" not in output
    _assert_identical(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_json_every_datatype(client: httpclient.InferenceServerClient, datatype: str) -> None:
    """JSON in and JSON out wherever tritonclient allows it; BF16 input must be binary
    (the client refuses it), so BF16 goes binary in, JSON out."""
    data = _values(datatype, json_safe=True)
    binary_in = datatype in CLIENT_REFUSES_JSON_INPUT
    result = _identity(client, datatype, data, binary_in=binary_in, binary_out=False)
    output = result.get_output("OUTPUT0")
    assert output["datatype"] == datatype
    assert output["shape"] == [2, 3]
    assert "data" in output and "parameters" not in output
    got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        # JSON carries BYTES as strings: tritonclient hands back str elements.
        expected = np.array([e.decode("utf-8") for e in data.reshape(-1)], dtype=object)
        _assert_identical(got, expected.reshape(data.shape))
    else:
        _assert_identical(got, data)


def test_client_refuses_bf16_json_input() -> None:
    """Documents the client-side limit the JSON test works around."""
    inp = httpclient.InferInput("INPUT0", [1, 2], "BF16")
    with pytest.raises(InferenceServerException, match="BF16 inputs must be sent as binary"):
        inp.set_data_from_numpy(np.zeros((1, 2), dtype=ml_dtypes.bfloat16), binary_data=False)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in CLIENT_REFUSES_JSON_INPUT])
def test_infer_json_input_binary_output(
    client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = _values(datatype, json_safe=True)
    result = _identity(client, datatype, data, binary_in=False, binary_out=True)
    _assert_identical(result.as_numpy("OUTPUT0"), data)


def test_json_uint64_max_next_to_small_values(client: httpclient.InferenceServerClient) -> None:
    """2**64-1 is a valid UINT64, also when other elements are small."""
    data = np.array([[2**64 - 1, 0]], dtype=np.uint64)
    result = _identity(client, "UINT64", data, binary_in=False, binary_out=True)
    _assert_identical(result.as_numpy("OUTPUT0"), data)


def test_json_uint64_keeps_precision(client: httpclient.InferenceServerClient) -> None:
    """UINT64 values above 2**53 must not pass through float64 (2**63+1 is not 2**63)."""
    data = np.array([[2**63 + 1, 1]], dtype=np.uint64)
    result = _identity(client, "UINT64", data, binary_in=False, binary_out=True)
    _assert_identical(result.as_numpy("OUTPUT0"), data)


def test_bytes_binary_byte_exact(client: httpclient.InferenceServerClient) -> None:
    """Non-ASCII, empty, NUL and invalid UTF-8 elements come back byte for byte."""
    elements = [
        "gr\u00fc\u00df \u6f22\u5b57".encode(),
        b"",
        b"\x00",
        b"a\x00b\x00",
        b"\xff\xfe\x80",
        b"\xc3",  # truncated UTF-8 sequence
        b"\xed\xa0\x80",  # an encoded surrogate: not valid UTF-8
        b"\x80" * 5 + b"ok",
    ]
    data = np.array(elements, dtype=object).reshape(1, -1)
    result = _identity(client, "BYTES", data, binary_in=True, binary_out=True)
    got = result.as_numpy("OUTPUT0")
    assert got.shape == data.shape
    assert [bytes(x) for x in got.reshape(-1)] == elements


def test_bytes_on_fixed_shape_model(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[b"one"], [b"\x00two"], [b"\xffthree"]], dtype=object)
    inp = httpclient.InferInput("INPUT0", [3, 1], "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer("bytes_one", [inp])
    _assert_identical(result.as_numpy("OUTPUT0"), data)


# --- the simple model ------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_add_sub(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple", _simple_inputs(a, b, binary), outputs=outputs)
    _assert_identical(result.as_numpy("OUTPUT0"), a + b)
    _assert_identical(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"


def test_simple_no_outputs_requested(client: httpclient.InferenceServerClient) -> None:
    """No ``outputs``: the client asks binary_data_output and gets every output."""
    a = np.array([np.arange(16), -np.arange(16)], dtype=np.int32)
    b = np.full((2, 16), 2**31 - 1, dtype=np.int32)
    b[1] = -(2**31)
    result = client.infer("simple", _simple_inputs(a, b))
    with np.errstate(over="ignore"):
        _assert_identical(result.as_numpy("OUTPUT0"), a + b)
        _assert_identical(result.as_numpy("OUTPUT1"), a - b)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_simple_one_output_requested(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer(
        "simple", _simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    _assert_identical(result.as_numpy("OUTPUT1"), np.zeros((1, 16), dtype=np.int32))
    assert result.as_numpy("OUTPUT0") is None


def test_simple_max_batch(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)
    b = np.arange(8 * 16, dtype=np.int32).reshape(8, 16)[::-1].copy()
    result = client.infer("simple", _simple_inputs(a, b))
    _assert_identical(result.as_numpy("OUTPUT0"), a + b)
    _assert_identical(result.as_numpy("OUTPUT1"), a - b)


def test_model_version_given(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, a), model_version="1")
    _assert_identical(result.as_numpy("OUTPUT0"), a * 2)
    assert result.get_response()["model_version"] == "1"


def test_request_id_echoed(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    result = client.infer("simple", _simple_inputs(a, a), request_id="req-\u00e9-42")
    assert result.get_response()["id"] == "req-\u00e9-42"
    result = client.infer("simple", _simple_inputs(a, a))
    assert "id" not in result.get_response()


def test_non_batching_model(client: httpclient.InferenceServerClient) -> None:
    data = np.linspace(-1, 1, 8, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [8], "FP32")
    inp.set_data_from_numpy(data)
    _assert_identical(client.infer("nobatch_fp32", [inp]).as_numpy("OUTPUT0"), data)


def test_mlp(client: httpclient.InferenceServerClient) -> None:
    data = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    inp = httpclient.InferInput("INPUT0", [3, 256], "FP32")
    inp.set_data_from_numpy(data)
    out = client.infer("mlp", [inp]).as_numpy("OUTPUT0")
    assert out.shape == (3, 10) and out.dtype == np.float32
    # Row independence: each row alone gives the same answer as in the batch.
    single = httpclient.InferInput("INPUT0", [1, 256], "FP32")
    single.set_data_from_numpy(data[1:2])
    np.testing.assert_allclose(
        client.infer("mlp", [single]).as_numpy("OUTPUT0"), out[1:2], rtol=1e-5, atol=1e-6
    )


def test_async_infer(client: httpclient.InferenceServerClient) -> None:
    """Concurrent requests each get their own rows back."""
    pending = []
    for i in range(12):
        a = np.full((1 + i % 3, 16), i, dtype=np.int32)
        b = np.arange(16, dtype=np.int32) * np.ones_like(a)
        pending.append(
            (a, b, client.async_infer("simple", _simple_inputs(a, b), request_id=str(i)))
        )
    for i, (a, b, request) in enumerate(pending):
        result = request.get_result(timeout=30)
        assert result.get_response()["id"] == str(i)
        _assert_identical(result.as_numpy("OUTPUT0"), a + b)
        _assert_identical(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_both_ways(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer(
        "simple",
        _simple_inputs(a, a),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    _assert_identical(result.as_numpy("OUTPUT0"), a * 2)
    _assert_identical(result.as_numpy("OUTPUT1"), a * 0)


# --- errors ----------------------------------------------------------------------------------


def _raises(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def test_unknown_model(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    expected = "Request for unknown model: 'x' is not found"
    for call in (
        lambda: client.infer("x", _simple_inputs(a, a)),
        lambda: client.get_model_metadata("x"),
        lambda: client.get_model_config("x"),
    ):
        error = _raises(call)
        assert error.status() == "400"
        assert error.message() == expected


def test_unknown_version(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    expected = "Request for unknown model: 'simple' version 2 is not found"
    for call in (
        lambda: client.infer("simple", _simple_inputs(a, a), model_version="2"),
        lambda: client.get_model_metadata("simple", "2"),
        lambda: client.get_model_config("simple", "2"),
    ):
        error = _raises(call)
        assert error.status() == "404"
        assert error.message() == expected


def test_wrong_datatype(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "FP32"),
        httpclient.InferInput("INPUT1", [1, 16], "FP32"),
    ]
    for inp in inputs:
        inp.set_data_from_numpy(a)
    error = _raises(lambda: client.infer("simple", inputs))
    assert error.status() == "400"
    assert error.message() == NO_ID + (
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"
    )


def test_wrong_shape(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((2, 8), dtype=np.int32)
    error = _raises(lambda: client.infer("simple", _simple_inputs(a, a)))
    assert error.status() == "400"
    assert error.message() == NO_ID + (
        f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [2,8]. "
        f"{BATCH_NOTE}"
    )


def test_batch_too_large(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((9, 16), dtype=np.int32)
    error = _raises(lambda: client.infer("simple", _simple_inputs(a, a), request_id="9 rows"))
    assert error.status() == "400"
    assert error.message() == (
        "[request id: 9 rows] inference request batch-size must be <= 8 for 'simple'"
    )


def test_duplicate_outputs(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0"),
        httpclient.InferRequestedOutput("OUTPUT0"),
    ]
    error = _raises(lambda: client.infer("simple", _simple_inputs(a, a), outputs=outputs))
    assert error.status() == "400"
    assert error.message() == NO_ID + "output 'OUTPUT0' already exists in request"
    assert client.is_server_live()


def test_missing_input(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    inp.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    error = _raises(lambda: client.infer("simple", [inp]))
    assert error.status() == "400"
    assert "INPUT1" in error.message()
