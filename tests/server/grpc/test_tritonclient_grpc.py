"""NVIDIA's ``tritonclient.grpc`` (and hand-built ``inference.GRPCInferenceService`` messages)
against the real server: health, metadata, config, inference for every datatype, typed
contents, concurrency, streaming, large tensors and every error mapping (triton-facts §0,
§2.2-2.4, §7.3, §7.5)."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import (
    InferenceServerException,
    triton_to_np_dtype,
)

from tests.model_repos import DATATYPES, identity_name
from tests.server_process import ServerProcess
from tests.triton_texts import NO_ID

MAX_MESSAGE = 2**31 - 1
RESERVED_TEXT = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)

#: Datatype -> the InferTensorContents field that carries it (FP16/BF16 have none).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

SIMPLE_A = np.arange(16, dtype=np.int32).reshape(1, 16)
SIMPLE_B = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(
        server.grpc_url,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE),
        ],
    )
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(autouse=True)
def still_serving_over_grpc(client: grpcclient.InferenceServerClient) -> Iterator[None]:
    """After every test, refusals included: a good gRPC request is still answered."""
    yield
    _assert_simple_ok(client)


# --- helpers ---------------------------------------------------------------------------------


def _values(datatype: str, seed: int = 0) -> np.ndarray:
    """A [2, 3] tensor (batch 2) of ``datatype`` with the type's extremes; ``seed`` shifts one
    element so that different requests carry different data."""
    if datatype == "BOOL":
        flat = [True, False, True, False, False, True]
        flat[seed % 6] = not flat[seed % 6]
        return np.array(flat).reshape(2, 3)
    if datatype == "BYTES":
        items: list[bytes] = [b"", b"\x00\xff", b"\xc3\x28 not utf-8", "h\u00e9llo".encode()]
        items += [b"x" * 300, f"seed {seed}".encode()]
        return np.array(items, dtype=object).reshape(2, 3)
    if datatype == "BF16":
        values = [1.5, -0.0, float("inf"), 3.0e38, -1.0e-38, 256.0 + 2 * seed]
        return np.array(values, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array(
            [info.min, info.max, 0, 1, info.max - 1, (seed % 100) + 2], dtype=dtype
        ).reshape(2, 3)
    finfo = np.finfo(dtype)
    values = [finfo.max, finfo.min, -0.0, float("-inf"), finfo.smallest_subnormal, 0.5 + seed]
    return np.array(values, dtype=dtype).reshape(2, 3)


def _assert_identical(got: np.ndarray | None, expected: np.ndarray) -> None:
    assert got is not None
    assert got.shape == expected.shape
    if expected.dtype == object:
        assert got.dtype == object
        assert list(got.reshape(-1)) == list(expected.reshape(-1))
        return
    assert got.dtype == expected.dtype
    # Byte-wise: distinguishes -0.0 from 0.0 and keeps infinities exact.
    assert got.tobytes() == expected.tobytes()


def _input(name: str, data: np.ndarray, datatype: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data)
    return inp


def _simple_inputs(
    a: np.ndarray = SIMPLE_A, b: np.ndarray = SIMPLE_B
) -> list[grpcclient.InferInput]:
    return [_input("INPUT0", a, "INT32"), _input("INPUT1", b, "INT32")]


def _length_prefixed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _raw_request(
    model: str, inputs: list[tuple[str, str, list[int], bytes]], **fields: Any
) -> service_pb2.ModelInferRequest:
    """A ``ModelInferRequest`` with ``raw_input_contents``, built by hand."""
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def _simple_raw_request(**fields: Any) -> service_pb2.ModelInferRequest:
    return _raw_request(
        "simple",
        [
            ("INPUT0", "INT32", [1, 16], SIMPLE_A.tobytes()),
            ("INPUT1", "INT32", [1, 16], SIMPLE_B.tobytes()),
        ],
        **fields,
    )


def _client_error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _rpc_error(call: Callable[[], Any]) -> grpc.Call:
    """What a call raised: grpc's ``_InactiveRpcError``, an ``RpcError`` that is also a
    ``grpc.Call`` (its ``details()`` a str, not the ``str | None`` of ``RpcError``'s stub)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    return cast(grpc.Call, info.value)


def _assert_simple_ok(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer("simple", _simple_inputs())
    _assert_identical(result.as_numpy("OUTPUT0"), SIMPLE_A + SIMPLE_B)
    _assert_identical(result.as_numpy("OUTPUT1"), SIMPLE_A - SIMPLE_B)


class Collector:
    """Thread-safe sink for tritonclient callbacks ``(result, error)``."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.results: list[grpcclient.InferResult] = []
        self.errors: list[InferenceServerException] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def __call__(
        self, result: grpcclient.InferResult | None, error: InferenceServerException | None
    ) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(error)
            else:
                self.results.append(result)
            if len(self.results) + len(self.errors) >= self.expected:
                self._done.set()

    def wait(self, timeout: float = 60.0) -> None:
        assert self._done.wait(timeout), (len(self.results), len(self.errors), self.expected)


# --- health, metadata, config ------------------------------------------------------------


def test_server_live_and_ready(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


def test_model_ready(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("identity_fp32") is True
    assert client.is_model_ready("dt_bf16") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("simple", "01") is True  # read as Triton does: version 1
    assert client.is_model_ready("no_such_model") is False
    # Not a version at all: Triton's INVALID_ARGUMENT and texts, for every RPC naming one.
    unreadable = "failed to get model version from specified version string"
    for version, text in (
        ("abc", f"{unreadable} 'abc' (details: stol), version should be an integral value > 0"),
        ("9223372036854775808", f"{unreadable} '9223372036854775808'"),
        ("1abc", f"{unreadable} '1abc'"),
        ("-1", "invalid model version specified '-1' , version should be an integral value > 0"),
    ):
        for call in (
            client.is_model_ready,
            client.get_model_metadata,
            client.get_model_config,
            client.get_inference_statistics,
        ):
            with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT") as error:
                call("simple", version)
            assert text in str(error.value)
    assert client.is_model_ready("simple", "1") is True


def test_server_metadata(client: grpcclient.InferenceServerClient, server: ServerProcess) -> None:
    meta = client.get_server_metadata()
    assert meta.name == "triton"
    assert meta.version
    for extension in ("binary_tensor_data", "model_configuration"):
        assert extension in meta.extensions
    as_json = client.get_server_metadata(as_json=True)
    status, _, body = server.request("GET", "/v2")
    assert status == 200
    assert as_json == json.loads(body)


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple")
    tensor = service_pb2.ModelMetadataResponse.TensorMetadata
    assert meta == service_pb2.ModelMetadataResponse(
        name="simple",
        versions=["1"],
        platform="onnxruntime_onnx",
        inputs=[
            tensor(name="INPUT0", datatype="INT32", shape=[-1, 16]),
            tensor(name="INPUT1", datatype="INT32", shape=[-1, 16]),
        ],
        outputs=[
            tensor(name="OUTPUT0", datatype="INT32", shape=[-1, 16]),
            tensor(name="OUTPUT1", datatype="INT32", shape=[-1, 16]),
        ],
    )
    assert client.get_model_metadata("simple", "1") == meta
    as_json = client.get_model_metadata("simple", as_json=True)
    assert as_json["versions"] == ["1"]
    # MessageToJson prints int64 as strings
    assert as_json["inputs"][0]["shape"] == ["-1", "16"]


def test_model_metadata_autocompleted_and_nonbatching(
    client: grpcclient.InferenceServerClient,
) -> None:
    meta = client.get_model_metadata("dt_bytes")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "BYTES", [-1, -1])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "BYTES", [-1, -1])
    ]
    meta = client.get_model_metadata("nobatch_fp32")
    assert [list(t.shape) for t in meta.inputs] == [[8]]


def test_model_metadata_matches_http(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    for model in ("simple", "identity_fp32", "nobatch_fp32", "dt_bf16"):
        status, _, body = server.request("GET", f"/v2/models/{model}")
        assert status == 200
        from_http = json_format.ParseDict(
            json.loads(body), service_pb2.ModelMetadataResponse()
        )
        assert client.get_model_metadata(model) == from_http


def test_model_config_proto(client: grpcclient.InferenceServerClient) -> None:
    response = client.get_model_config("simple")
    assert isinstance(response, service_pb2.ModelConfigResponse)
    config = response.config
    assert config.name == "simple"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_INT32, [16]),
        ("INPUT1", model_config_pb2.TYPE_INT32, [16]),
    ]
    assert [(t.name, list(t.dims)) for t in config.output] == [
        ("OUTPUT0", [16]),
        ("OUTPUT1", [16]),
    ]
    assert not config.HasField("dynamic_batching")
    assert client.get_model_config("simple", "1") == response

    auto = client.get_model_config("identity_fp32").config
    assert auto.max_batch_size == 4
    assert list(auto.input[0].dims) == [-1]
    assert auto.input[0].data_type == model_config_pb2.TYPE_FP32
    assert auto.HasField("dynamic_batching")
    assert auto.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU

    nobatch = client.get_model_config("nobatch_fp32").config
    assert nobatch.max_batch_size == 0
    assert list(nobatch.input[0].dims) == [8]


def test_model_config_as_json(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple", as_json=True)["config"]
    assert config["name"] == "simple"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["input"][0]["dims"] == ["16"]  # int64 as a string in proto JSON


def test_model_config_is_the_http_config(
    client: grpcclient.InferenceServerClient, server: ServerProcess
) -> None:
    """The gRPC ``ModelConfig`` is the message the HTTP config route prints."""
    for model in ("simple", "identity_fp32", "nobatch_fp32", "dt_bytes"):
        status, _, body = server.request("GET", f"/v2/models/{model}/config")
        assert status == 200
        from_http = json_format.ParseDict(json.loads(body), model_config_pb2.ModelConfig())
        assert client.get_model_config(model).config == from_http


def test_health_check_serving(channel: grpc.Channel) -> None:
    # types-grpcio-health-checking declares HealthStub without its Check and Watch.
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "inference.GRPCInferenceService"):
        reply = health.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service=service), timeout=10
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    error = _rpc_error(
        lambda: health.Check(  # type: ignore[attr-defined]
            health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10
        )
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


# --- inference -------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
def test_infer_every_datatype(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    data = _values(datatype)
    result = client.infer(
        identity_name(datatype),
        [_input("INPUT0", data, datatype)],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
        request_id=f"id-{datatype}",
    )
    response = result.get_response()
    assert response.id == f"id-{datatype}"
    assert response.model_name == identity_name(datatype)
    assert response.model_version == "1"
    output = result.get_output("OUTPUT0")
    assert (output.datatype, list(output.shape)) == (datatype, [2, 3])
    assert len(response.raw_output_contents) == 1
    _assert_identical(result.as_numpy("OUTPUT0"), data)


def test_infer_bytes_empty_and_binary_elements(client: grpcclient.InferenceServerClient) -> None:
    elements = [b"", b"\x00", b"\xff\xfe", b"\x80abc\x00def", b"", b"\xc3\x28"]
    data = np.array(elements, dtype=object).reshape(1, 6)
    result = client.infer("dt_bytes", [_input("INPUT0", data, "BYTES")])
    response = result.get_response()
    assert response.raw_output_contents[0] == _length_prefixed(elements)
    _assert_identical(result.as_numpy("OUTPUT0"), data)
    # a tensor of empty strings only
    empty = np.array([b"", b"", b""], dtype=object).reshape(1, 3)
    _assert_identical(
        client.infer("dt_bytes", [_input("INPUT0", empty, "BYTES")]).as_numpy("OUTPUT0"), empty
    )


def test_infer_all_outputs_in_order_when_none_requested(
    client: grpcclient.InferenceServerClient,
) -> None:
    result = client.infer("simple", _simple_inputs())
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert len(response.raw_output_contents) == 2
    assert response.raw_output_contents[0] == (SIMPLE_A + SIMPLE_B).tobytes()
    assert response.raw_output_contents[1] == (SIMPLE_A - SIMPLE_B).tobytes()


def test_infer_requested_outputs_keep_the_request_order(
    client: grpcclient.InferenceServerClient,
) -> None:
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT1", "OUTPUT0")]
    result = client.infer("simple", _simple_inputs(), outputs=outputs)
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1", "OUTPUT0"]
    assert response.raw_output_contents[0] == (SIMPLE_A - SIMPLE_B).tobytes()
    assert response.raw_output_contents[1] == (SIMPLE_A + SIMPLE_B).tobytes()
    only = client.infer(
        "simple", _simple_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")]
    )
    assert [o.name for o in only.get_response().outputs] == ["OUTPUT1"]
    assert len(only.get_response().raw_output_contents) == 1


def test_infer_with_version_priority_timeout_and_custom_parameters(
    client: grpcclient.InferenceServerClient,
) -> None:
    """tritonclient sends ``priority`` as uint64 and ``timeout`` as int64."""
    result = client.infer(
        "simple",
        _simple_inputs(),
        model_version="1",
        priority=3,
        timeout=10_000_000,
        parameters={"s": "text", "b": True, "i": -5, "d": 0.25},
    )
    assert result.get_response().model_version == "1"
    _assert_identical(result.as_numpy("OUTPUT0"), SIMPLE_A + SIMPLE_B)


def test_infer_zero_elements_still_has_a_raw_output_entry(
    client: grpcclient.InferenceServerClient,
) -> None:
    """perf_analyzer indexes ``raw_output_contents[i]`` for every output, even empty ones."""
    data = np.zeros((1, 0), np.float32)
    result = client.infer("identity_fp32", [_input("INPUT0", data, "FP32")])
    response = result.get_response()
    assert list(response.outputs[0].shape) == [1, 0]
    assert list(response.raw_output_contents) == [b""]
    _assert_identical(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_infer_with_compression(
    client: grpcclient.InferenceServerClient, algorithm: str
) -> None:
    data = np.arange(4096, dtype=np.float32).reshape(1, 4096)
    result = client.infer(
        "identity_fp32", [_input("INPUT0", data, "FP32")], compression_algorithm=algorithm
    )
    _assert_identical(result.as_numpy("OUTPUT0"), data)


def _typed_request(datatype: str, data: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype), id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=list(data.shape))
    values: list[Any] = list(data.reshape(-1))
    if datatype != "BYTES":
        values = data.reshape(-1).tolist()
    getattr(tensor.contents, CONTENTS_FIELD[datatype]).extend(values)
    return request


@pytest.mark.parametrize("datatype", sorted(CONTENTS_FIELD))
def test_infer_typed_contents_every_datatype(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    data = _values(datatype)
    if datatype == "FP32":  # what a float field carries exactly
        data = data.astype(np.float32)
    response = stub.ModelInfer(_typed_request(datatype, data), timeout=30)
    assert response.id == "typed"
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("OUTPUT0", datatype, [2, 3])
    ]
    # the reply is raw, whatever the request used
    assert len(response.raw_output_contents) == 1
    assert not response.outputs[0].HasField("contents")
    if datatype == "BYTES":
        assert response.raw_output_contents[0] == _length_prefixed(list(data.reshape(-1)))
    else:
        assert response.raw_output_contents[0] == data.tobytes()
    _assert_identical(grpcclient.InferResult(response).as_numpy("OUTPUT0"), data)


def test_infer_typed_bytes_contents_many_elements(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """qa/L0_grpc test_bytes_contents_many_elements_serialization, scaled down."""
    count = 100_000
    request = service_pb2.ModelInferRequest(model_name="dt_bytes")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, count])
    tensor.contents.bytes_contents.extend([b"a"] * count)
    response = stub.ModelInfer(request, timeout=60)
    assert list(response.outputs[0].shape) == [1, count]
    assert response.raw_output_contents[0] == b"\x01\x00\x00\x00a" * count


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_infer_typed_contents_refused_for_fp16_bf16(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str
) -> None:
    request = service_pb2.ModelInferRequest(model_name=identity_name(datatype))
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in error.details()


def test_infer_mixing_raw_and_typed_contents_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = _simple_raw_request()
    request.inputs[1].contents.int_contents.extend([1] * 16)
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Triton's text, which NVIDIA's grpc_explicit_int_content_client.py matches
    assert error.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT1' for "
        "model 'simple'"
    )


def test_infer_raw_contents_count_mismatch_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = _simple_raw_request()
    del request.raw_input_contents[1]
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw input contents" in error.details()


def test_enable_empty_final_response_accepted(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """The C++ client (perf_analyzer) sends this on every request."""
    request = _simple_raw_request(id="cpp")
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    request.parameters["priority"].uint64_param = 1
    request.parameters["timeout"].int64_param = 1_000_000
    response = stub.ModelInfer(request, timeout=30)
    assert response.id == "cpp"
    assert response.raw_output_contents[0] == (SIMPLE_A + SIMPLE_B).tobytes()
    # not a streamed reply: no final flag
    assert "triton_final_response" not in response.parameters


@pytest.mark.parametrize("key", ["triton_final_response", "triton_other"])
def test_other_reserved_parameters_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, key: str
) -> None:
    request = _simple_raw_request()
    request.parameters[key].bool_param = True
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == RESERVED_TEXT


@pytest.mark.parametrize(
    "key, kind, value",
    [
        ("priority", "int64_param", -1),
        ("priority", "string_param", "1"),
        ("timeout", "uint64_param", 1000),
        ("timeout", "int64_param", -1),
    ],
)
def test_wrongly_typed_scheduling_parameters_refused(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, key: str, kind: str, value: Any
) -> None:
    request = _simple_raw_request()
    setattr(request.parameters[key], kind, value)
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert key in error.details()


def test_async_infer_many_in_flight(client: grpcclient.InferenceServerClient) -> None:
    count = 50
    collector = Collector(count)
    sent: dict[str, np.ndarray] = {}
    for i in range(count):
        data = (np.arange(4, dtype=np.float32) + 1000 * i).reshape(1, 4)
        sent[f"req-{i}"] = data
        client.async_infer(
            "identity_fp32",
            [_input("INPUT0", data, "FP32")],
            collector,
            request_id=f"req-{i}",
        )
    collector.wait()
    assert collector.errors == []
    seen = set()
    for result in collector.results:
        request_id = result.get_response().id
        seen.add(request_id)
        _assert_identical(result.as_numpy("OUTPUT0"), sent[request_id])
    assert seen == set(sent)


def test_async_infer_many_in_flight_on_add_sub(client: grpcclient.InferenceServerClient) -> None:
    """Different batch sizes in flight together on a model with two inputs and two outputs."""
    count = 48
    collector = Collector(count)
    sent: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for i in range(count):
        rows = 1 + i % 3
        a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16) * (i + 1)
        b = np.full((rows, 16), i, dtype=np.int32)
        sent[str(i)] = (a, b)
        client.async_infer("simple", _simple_inputs(a, b), collector, request_id=str(i))
    collector.wait()
    assert collector.errors == []
    assert sorted(r.get_response().id for r in collector.results) == sorted(sent)
    for result in collector.results:
        a, b = sent[result.get_response().id]
        _assert_identical(result.as_numpy("OUTPUT0"), a + b)
        _assert_identical(result.as_numpy("OUTPUT1"), a - b)


def test_async_infer_error_reaches_the_callback(client: grpcclient.InferenceServerClient) -> None:
    collector = Collector(1)
    client.async_infer("no_such_model", _simple_inputs(), collector)
    collector.wait()
    assert collector.results == []
    (error,) = collector.errors
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "Request for unknown model: 'no_such_model' is not found"


def test_stream_many_requests_with_an_error_mid_stream(
    server: ServerProcess,
) -> None:
    count = 40
    bad_at = 20
    collector = Collector(count + 1)
    sent: dict[str, np.ndarray] = {}
    with grpcclient.InferenceServerClient(server.grpc_url) as stream_client:
        stream_client.start_stream(callback=collector)
        try:
            for i in range(count):
                if i == bad_at:
                    stream_client.async_stream_infer(
                        "no_such_model",
                        [_input("INPUT0", np.zeros((1, 4), np.float32), "FP32")],
                        request_id="bad",
                    )
                data = _values("INT64", seed=i)
                sent[f"s{i}"] = data
                stream_client.async_stream_infer(
                    "dt_int64",
                    [_input("INPUT0", data, "INT64")],
                    request_id=f"s{i}",
                    enable_empty_final_response=i % 2 == 0,
                )
            collector.wait(timeout=20)
        finally:
            stream_client.stop_stream()
    assert [e.message() for e in collector.errors] == [
        "Request for unknown model: 'no_such_model' is not found"
    ]
    assert sorted(r.get_response().id for r in collector.results) == sorted(sent)
    for result in collector.results:
        response = result.get_response()
        _assert_identical(result.as_numpy("OUTPUT0"), sent[response.id])
        # Triton marks every complete streamed reply as final
        assert response.parameters["triton_final_response"].bool_param is True


def test_stream_error_reply_carries_the_id_and_the_stream_goes_on(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    requests = [
        _simple_raw_request(id="first"),
        _raw_request(
            "no_such_model",
            [("INPUT0", "FP32", [1, 1], b"\x00" * 4)],
            id="unknown-model",
        ),
        _raw_request(
            "simple", [("INPUT0", "INT32", [1, 16], SIMPLE_A.tobytes())], id="missing-input"
        ),
        _simple_raw_request(id="last"),
    ]
    replies = list(stub.ModelStreamInfer(iter(requests), timeout=60))
    assert len(replies) == 4
    by_id = {reply.infer_response.id: reply for reply in replies}
    assert set(by_id) == {"first", "unknown-model", "missing-input", "last"}
    assert (
        by_id["unknown-model"].error_message
        == "Request for unknown model: 'no_such_model' is not found"
    )
    assert by_id["missing-input"].error_message.startswith(
        "[request id: missing-input] expected 2 inputs but got 1 inputs for model 'simple'"
    )
    for ok in ("first", "last"):
        reply = by_id[ok]
        assert reply.error_message == ""
        assert reply.infer_response.model_name == "simple"
        assert reply.infer_response.raw_output_contents[0] == (SIMPLE_A + SIMPLE_B).tobytes()


def test_stream_of_large_requests_each_answered_with_its_own_data(
    server: ServerProcess,
) -> None:
    """Messages over ``POOLED_MESSAGE_BYTES`` are each received into a pooled buffer (the
    front end's arena) and run concurrently: every reply holds its own request's data, an
    error mid-stream included, and the buffers are reused by the requests that follow."""
    count = 24
    collector = Collector(count + 1)
    sent: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(7)
    with grpcclient.InferenceServerClient(server.grpc_url) as stream_client:
        stream_client.start_stream(callback=collector)
        try:
            for i in range(count):
                if i == count // 2:
                    stream_client.async_stream_infer(
                        "simple",
                        [_input("INPUT0", np.zeros((1, 50_000), np.int32), "INT32")],
                        request_id="bad",
                    )
                # 256 KiB to 1 MiB, different each time
                data = rng.random((1, 65536 * (1 + i % 4)), dtype=np.float32)
                sent[f"big{i}"] = data
                stream_client.async_stream_infer(
                    "identity_fp32", [_input("INPUT0", data, "FP32")], request_id=f"big{i}"
                )
            collector.wait(timeout=60)
        finally:
            stream_client.stop_stream()
    assert len(collector.errors) == 1
    assert sorted(r.get_response().id for r in collector.results) == sorted(sent)
    for result in collector.results:
        _assert_identical(result.as_numpy("OUTPUT0"), sent[result.get_response().id])


def test_large_tensor_round_trip(client: grpcclient.InferenceServerClient) -> None:
    """64 MiB each way: past grpcio's 4 MiB default limit."""
    count = 16 * 1024 * 1024
    data = np.arange(count, dtype=np.float32).reshape(1, count)
    result = client.infer(
        "identity_fp32", [_input("INPUT0", data, "FP32")], client_timeout=120
    )
    raw = result.get_response().raw_output_contents[0]
    assert len(raw) == 64 * 1024 * 1024
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (1, count) and got.dtype == np.float32
    assert np.array_equal(got, data)


# --- errors ----------------------------------------------------------------------------------


def test_unknown_model_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    text = "Request for unknown model: 'no_such_model' is not found"
    for call in (
        lambda: client.infer("no_such_model", _simple_inputs()),
        lambda: client.get_model_metadata("no_such_model"),
        lambda: client.get_model_config("no_such_model"),
    ):
        error = _client_error(call)
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == text


def test_unknown_model_or_version_wins_over_a_bad_request(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    """Triton resolves the model before it reads the inputs."""
    for model, version, code, text in (
        (
            "no_such_model", "", grpc.StatusCode.INVALID_ARGUMENT,
            "Request for unknown model: 'no_such_model' is not found",
        ),
        (
            "simple", "3", grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'simple' version 3 is not found",
        ),
    ):
        request = _raw_request(model, [("INPUT0", "NOT_A_TYPE", [-1], b"")], model_version=version)
        request.raw_input_contents.append(b"extra")
        request.parameters["triton_other"].bool_param = True
        error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))  # noqa: B023
        assert (error.code(), error.details()) == (code, text)


@pytest.mark.parametrize("version, number", [("2", 2), ("99", 99), ("0099", 99)])
def test_unknown_version_is_not_found(
    client: grpcclient.InferenceServerClient, version: str, number: int
) -> None:
    """Named by its number, as Triton reads the string (leading zeros dropped)."""
    text = f"Request for unknown model: 'simple' version {number} is not found"
    for call in (
        lambda: client.infer("simple", _simple_inputs(), model_version=version),
        lambda: client.get_model_metadata("simple", version),
        lambda: client.get_model_config("simple", version),
        lambda: client.get_inference_statistics("simple", version),
    ):
        error = _client_error(call)
        assert error.status() == "StatusCode.NOT_FOUND"
        assert error.message() == text


def test_bad_inputs_are_invalid_argument(
    client: grpcclient.InferenceServerClient, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    # unexpected input name
    inputs = [_input("INPUT0", SIMPLE_A, "INT32"), _input("NOPE", SIMPLE_B, "INT32")]
    error = _client_error(lambda: client.infer("simple", inputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == "unexpected inference input 'NOPE' for model 'simple'"
    # missing input (qa/L0_input_validation)
    error = _client_error(lambda: client.infer("simple", _simple_inputs()[:1]))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == NO_ID + (
        "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
        "missing required input(s) ['INPUT1']. Please provide all required input(s)."
    )
    # wrong shape
    a = np.zeros((1, 15), np.int32)
    error = _client_error(lambda: client.infer("simple", _simple_inputs(a, a)))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0' for model 'simple'" in error.message()
    # byte size mismatch, built by hand (the client checks sizes itself)
    request = _raw_request(
        "identity_fp32", [("INPUT0", "FP32", [1, 8], np.zeros(10, np.float32).tobytes())]
    )
    rpc_error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert rpc_error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error.details() == NO_ID + (
        "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. "
        "Expected 32, got 40"
    )
    # duplicate requested outputs (qa/L0_grpc test_duplicate_output_names_rejected)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0")] * 2
    error = _client_error(lambda: client.infer("simple", _simple_inputs(), outputs=outputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == NO_ID + "output 'OUTPUT0' already exists in request"
    _assert_simple_ok(client)


def test_wrong_datatype_is_invalid_argument(client: grpcclient.InferenceServerClient) -> None:
    a = SIMPLE_A.astype(np.float32)
    inputs = [_input("INPUT0", a, "FP32"), _input("INPUT1", SIMPLE_B, "INT32")]
    error = _client_error(lambda: client.infer("simple", inputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == NO_ID + (
        "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"
    )


def test_unknown_datatype_name_is_invalid_argument(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = _raw_request("identity_fp32", [("INPUT0", "FLOAT", [1, 1], b"\x00" * 4)])
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid datatype 'FLOAT'" in error.details()


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_system_shared_memory_status(),
        lambda c: c.register_system_shared_memory("r", "/k", 8),
        lambda c: c.unregister_system_shared_memory(),
        lambda c: c.get_cuda_shared_memory_status(),
        lambda c: c.unregister_cuda_shared_memory(),
    ],
)
def test_shared_memory_is_off_by_default(
    client: grpcclient.InferenceServerClient,
    call: Callable[[grpcclient.InferenceServerClient], Any],
) -> None:
    """As Triton since --allow-client-shm defaults to false."""
    error = _client_error(lambda: call(client))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Client shared memory is disabled" in error.message()


def test_cuda_register_via_stub_is_refused_while_disabled(
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    request = service_pb2.CudaSharedMemoryRegisterRequest(
        name="r", raw_handle=b"\x00" * 64, device_id=0, byte_size=8
    )
    error = _rpc_error(lambda: stub.CudaSharedMemoryRegister(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Client shared memory is disabled" in error.details()


def test_model_fault_is_internal_and_the_model_keeps_serving(
    client: grpcclient.InferenceServerClient,
) -> None:
    bad = np.ones((1, 4), np.float32)
    error = _client_error(lambda: client.infer("rows_of_three", [_input("INPUT0", bad, "FP32")]))
    assert error.status() == "StatusCode.INTERNAL"
    assert error.message().startswith("model 'rows_of_three' version 1 failed: ")
    assert "Reshape" in error.message()
    good = np.arange(6, dtype=np.float32).reshape(1, 6)
    result = client.infer("rows_of_three", [_input("INPUT0", good, "FP32")])
    _assert_identical(result.as_numpy("OUTPUT0"), good.reshape(2, 3))


# --- HTTP and gRPC say the same thing --------------------------------------------------------

@dataclass(frozen=True)
class Mistake:
    """One wrong request, sent as JSON over HTTP and with raw contents over gRPC."""

    model: str
    inputs: list[tuple[str, str, np.ndarray]]
    http_status: int
    grpc_code: grpc.StatusCode
    version: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


_SIMPLE_INPUTS = [("INPUT0", "INT32", SIMPLE_A), ("INPUT1", "INT32", SIMPLE_B)]
_INVALID = grpc.StatusCode.INVALID_ARGUMENT

MISTAKES: dict[str, Mistake] = {
    "unknown model": Mistake("no_such_model", [("INPUT0", "INT32", SIMPLE_A)], 400, _INVALID),
    "unknown version": Mistake(
        "simple", _SIMPLE_INPUTS, 404, grpc.StatusCode.NOT_FOUND, version="7"
    ),
    "wrong datatype": Mistake(
        "simple",
        [("INPUT0", "FP32", SIMPLE_A.astype(np.float32)), ("INPUT1", "INT32", SIMPLE_B)],
        400,
        _INVALID,
    ),
    "missing input": Mistake("simple", [("INPUT1", "INT32", SIMPLE_B)], 400, _INVALID),
    "unexpected input": Mistake(
        "simple", [*_SIMPLE_INPUTS, ("X", "INT32", SIMPLE_B)], 400, _INVALID
    ),
    "duplicate input": Mistake(
        "simple", [("INPUT0", "INT32", SIMPLE_A), ("INPUT0", "INT32", SIMPLE_B)], 400, _INVALID
    ),
    "wrong shape": Mistake(
        "simple",
        [("INPUT0", "INT32", SIMPLE_A[:, :8]), ("INPUT1", "INT32", SIMPLE_B[:, :8])],
        400,
        _INVALID,
    ),
    "batch too large": Mistake(
        "simple",
        [
            ("INPUT0", "INT32", np.zeros((9, 16), np.int32)),
            ("INPUT1", "INT32", np.zeros((9, 16), np.int32)),
        ],
        400,
        _INVALID,
    ),
    "reserved parameter": Mistake(
        "simple", _SIMPLE_INPUTS, 400, _INVALID, parameters={"triton_other": True}
    ),
    "negative priority": Mistake(
        "simple", _SIMPLE_INPUTS, 400, _INVALID, parameters={"priority": -1}
    ),
    "unknown output": Mistake("simple", _SIMPLE_INPUTS, 400, _INVALID, outputs=[("X", {})]),
    "duplicate output": Mistake(
        "simple", _SIMPLE_INPUTS, 400, _INVALID, outputs=[("OUTPUT0", {}), ("OUTPUT0", {})]
    ),
    "negative class count": Mistake(
        "simple", _SIMPLE_INPUTS, 400, _INVALID, outputs=[("OUTPUT0", {"classification": -1})]
    ),
    "model fault": Mistake(
        "rows_of_three",
        [("INPUT0", "FP32", np.ones((1, 4), np.float32))],
        500,
        grpc.StatusCode.INTERNAL,
    ),
}


def _set_parameters(params: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            params[key].bool_param = value
        else:
            params[key].int64_param = value


@pytest.mark.parametrize("name", sorted(MISTAKES))
@pytest.mark.usefixtures("assert_still_serving")  # and HTTP still serves after its refusal
def test_http_and_grpc_give_the_same_error(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub, name: str
) -> None:
    mistake = MISTAKES[name]
    body: dict[str, Any] = {
        "inputs": [
            {"name": n, "datatype": dt, "shape": list(a.shape), "data": a.reshape(-1).tolist()}
            for n, dt, a in mistake.inputs
        ],
        "parameters": mistake.parameters,
    }
    if mistake.outputs:
        body["outputs"] = [{"name": n, "parameters": p} for n, p in mistake.outputs]
    version = f"/versions/{mistake.version}" if mistake.version else ""
    path = f"/v2/models/{mistake.model}{version}/infer"
    status, _, reply = server.request("POST", path, json.dumps(body).encode())
    assert status == mistake.http_status, reply
    http_message = json.loads(reply)["error"]

    request = _raw_request(
        mistake.model,
        [(n, dt, list(a.shape), a.tobytes()) for n, dt, a in mistake.inputs],
        model_version=mistake.version,
    )
    _set_parameters(request.parameters, mistake.parameters)
    for output_name, output_params in mistake.outputs:
        _set_parameters(request.outputs.add(name=output_name).parameters, output_params)
    error = _rpc_error(lambda: stub.ModelInfer(request, timeout=30))
    assert error.code() == mistake.grpc_code
    assert error.details() == http_message
