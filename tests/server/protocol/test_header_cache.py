"""Unit tests for server.protocol.header_cache: a repeated header, decoded once (HTTP, gRPC)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument
from server.generated import grpc_service_pb2 as pb
from server.generated import model_config_pb2 as mc
from server.protocol import grpc_codec
from server.protocol.header_cache import MAX_HEADER, HeaderCache, decode_grpc, decode_rest
from server.protocol.model_spec import ModelSpec
from server.protocol.rest_codec import decode_request, parse_json
from server.protocol.types import InferRequest


def _spec(dims: str = "[ 4 ]", name: str = "m") -> ModelSpec:
    config = text_format.Parse(
        f'name: "{name}" max_batch_size: 8 '
        f'input {{ name: "A" data_type: TYPE_INT32 dims: {dims} }} '
        'input { name: "B" data_type: TYPE_BOOL dims: [ 2 ] } '
        'input { name: "S" data_type: TYPE_STRING dims: [ 1 ] } '
        'output { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] }',
        mc.ModelConfig(),
    )
    return ModelSpec.from_config(config)


SPEC = _spec()


def _header(**extra: Any) -> bytes:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [1, 4],
             "parameters": {"binary_data_size": 16}},
            {"name": "B", "datatype": "BOOL", "shape": [1, 2],
             "parameters": {"binary_data_size": 2}},
            {"name": "S", "datatype": "BYTES", "shape": [1, 1],
             "parameters": {"binary_data_size": 7}},
        ],
        "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
        **extra,
    }
    return orjson.dumps(body)


def _binary(first: int, flags: bytes = b"\x01\x00", text: bytes = b"abc") -> bytes:
    words = np.arange(first, first + 4, dtype=np.int32).tobytes()
    return words + flags + len(text).to_bytes(4, "little") + text


def _decode(cache: HeaderCache, header: bytes, binary: bytes, spec: ModelSpec = SPEC,
            model: str = "m", version: str = "1") -> InferRequest:
    return decode_rest(cache, memoryview(header), memoryview(binary), model, version, spec,
                       1 << 20)


def _uncached(header: bytes, binary: bytes, spec: ModelSpec = SPEC) -> InferRequest:
    return decode_request(parse_json(header), memoryview(binary), "m", "1", spec, 1 << 20)


def _same(got: InferRequest, want: InferRequest) -> None:
    assert (got.model_name, got.model_version, got.id, got.parameters) == (
        want.model_name, want.model_version, want.id, want.parameters)
    assert got.outputs == want.outputs
    assert len(got.inputs) == len(want.inputs)
    for mine, theirs in zip(got.inputs, want.inputs, strict=True):
        assert (mine.name, mine.datatype, mine.shape, mine.parameters, mine.shared_memory) == (
            theirs.name, theirs.datatype, theirs.shape, theirs.parameters, theirs.shared_memory)
        assert mine.data.dtype == theirs.data.dtype
        assert np.array_equal(mine.data, theirs.data)


def test_a_repeated_header_decodes_as_the_first_did_with_the_new_bytes() -> None:
    cache = HeaderCache()
    header = _header(id="r7", parameters={"priority": 2})
    first = _decode(cache, header, _binary(0))
    assert len(cache) == 1
    second = _decode(cache, header, _binary(100, b"\x00\x01", b"xyz"))
    assert len(cache) == 1
    _same(first, _uncached(header, _binary(0)))
    _same(second, _uncached(header, _binary(100, b"\x00\x01", b"xyz")))
    assert second.inputs[0].data.tolist() == [[100, 101, 102, 103]]
    assert second.inputs[2].data.tolist() == [[b"xyz"]]
    assert first.inputs[0].data.tolist() == [[0, 1, 2, 3]]  # the first request is untouched


def test_every_request_gets_its_own_parameters_and_outputs() -> None:
    cache = HeaderCache()
    header = _header(parameters={"priority": 2})
    first = _decode(cache, header, _binary(0))
    first.parameters["priority"] = 9
    first.inputs[0].parameters["binary_data_size"] = 1
    assert first.outputs is not None
    first.outputs[0].parameters["binary_data"] = False
    first.outputs.clear()
    second = _decode(cache, header, _binary(0))
    third = _decode(cache, header, _binary(0))
    for request in (second, third):
        _same(request, _uncached(header, _binary(0)))
    assert second.parameters is not third.parameters
    assert second.inputs[0].parameters is not third.inputs[0].parameters


@pytest.mark.parametrize(
    "binary",
    [
        b"",  # no binary part at all
        _binary(0)[:10],  # shorter than the first input
        _binary(0)[:17],  # shorter than the second
        _binary(0) + b"\x00",  # a byte left over
        _binary(0, flags=b"\x02\x00"),  # not a BOOL
        _binary(0)[:18] + (9).to_bytes(4, "little") + b"abc",  # a BYTES length past the end
    ],
)
def test_a_repeated_header_refuses_a_bad_body_as_a_first_decode_does(binary: bytes) -> None:
    cache = HeaderCache()
    header = _header()
    _decode(cache, header, _binary(0))  # now known
    with pytest.raises(InvalidArgument) as uncached:
        _uncached(header, binary)
    with pytest.raises(InvalidArgument) as cached:
        _decode(cache, header, binary)
    assert str(cached.value) == str(uncached.value)
    assert cached.value.http_status == 400
    assert len(cache) == 1
    _same(_decode(cache, header, _binary(5)), _uncached(header, _binary(5)))  # still served


def test_a_refused_header_is_not_kept() -> None:
    cache = HeaderCache()
    header = _header(parameters={"triton_x": 1})
    for _ in range(2):
        with pytest.raises(InvalidArgument):
            _decode(cache, header, _binary(0))
    assert len(cache) == 0


def test_a_header_with_json_data_or_a_region_is_decoded_every_time() -> None:
    cache = HeaderCache()
    json_input = orjson.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
    ]})
    assert _decode(cache, json_input, b"").inputs[0].data.tolist() == [[1, 2, 3, 4]]
    in_region = orjson.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4],
         "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}},
    ]})
    assert _decode(cache, in_region, b"").inputs[0].shared_memory is not None
    assert len(cache) == 0


def test_a_long_header_is_decoded_every_time() -> None:
    cache = HeaderCache()
    header = _header(id="x" * MAX_HEADER)
    _same(_decode(cache, header, _binary(0)), _uncached(header, _binary(0)))
    assert len(cache) == 0


def test_a_reloaded_model_decodes_the_header_against_its_new_spec() -> None:
    cache = HeaderCache()
    header = _header()
    _decode(cache, header, _binary(0))
    reloaded = _spec(dims="[ 3 ]")  # the same header no longer fits
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'A'"):
        _decode(cache, header, _binary(0), reloaded)
    assert len(cache) == 1  # (the old plan stays until replaced or dropped)
    again = _spec()
    _same(_decode(cache, header, _binary(3), again), _uncached(header, _binary(3), again))


def test_model_and_version_are_part_of_the_key() -> None:
    cache = HeaderCache()
    header = _header()
    other = _spec(name="other")
    assert _decode(cache, header, _binary(0), model="m", version="1").model_version == "1"
    assert _decode(cache, header, _binary(0), model="m", version="").model_version == ""
    request = _decode(cache, header, _binary(0), other, model="other")
    assert request.model_name == "other"
    assert len(cache) == 3


def test_the_oldest_header_is_dropped_when_full() -> None:
    cache = HeaderCache(capacity=2)
    headers = [_header(id=str(n)) for n in range(3)]
    for header in headers:
        _decode(cache, header, _binary(0))
    assert len(cache) == 2
    for n, header in enumerate(headers):
        assert _decode(cache, header, _binary(0)).id == str(n)
    assert len(cache) == 2


# ---- gRPC ----------------------------------------------------------------------------------


def _message(first: int = 0, *, flags: bytes = b"\x01\x00", text: bytes = b"abc",
             request_id: str = "", raw: list[bytes] | None = None) -> bytes:
    message = pb.ModelInferRequest(model_name="m", model_version="1", id=request_id)
    message.parameters["custom"].string_param = "yes"
    for name, datatype, shape in (("A", "INT32", [1, 4]), ("B", "BOOL", [1, 2]),
                                  ("S", "BYTES", [1, 1])):
        tensor = message.inputs.add(name=name, datatype=datatype, shape=shape)
        tensor.parameters["note"].string_param = name
    message.outputs.add(name="Y")
    words = np.arange(first, first + 4, dtype=np.int32).tobytes()
    contents = raw if raw is not None else [words, flags, len(text).to_bytes(4, "little") + text]
    message.raw_input_contents.extend(contents)
    return message.SerializeToString()


def _grpc(cache: HeaderCache, data: bytes, spec: ModelSpec = SPEC,
          split: bool = False) -> InferRequest:
    """Decoded as the servicer does: a small message parsed whole, or a large one split."""
    message, raw = grpc_codec.split_request(data, whole_if_small=not split)
    return decode_grpc(cache, message, spec, raw)


def _grpc_uncached(data: bytes, spec: ModelSpec = SPEC) -> InferRequest:
    return grpc_codec.decode_request(pb.ModelInferRequest.FromString(data), spec)


@pytest.mark.parametrize("split", [False, True])
def test_grpc_a_repeated_header_decodes_as_the_first_did_with_the_new_bytes(split: bool) -> None:
    cache = HeaderCache()
    first = _grpc(cache, _message(0, request_id="r1"), split=split)
    assert len(cache) == 1
    second = _grpc(cache, _message(100, flags=b"\x00\x01", text=b"xyz", request_id="r1"),
                   split=split)
    assert len(cache) == 1
    _same(first, _grpc_uncached(_message(0, request_id="r1")))
    _same(second, _grpc_uncached(_message(100, flags=b"\x00\x01", text=b"xyz",
                                          request_id="r1")))
    assert second.inputs[0].data.tolist() == [[100, 101, 102, 103]]
    assert second.inputs[2].data.tolist() == [[b"xyz"]]
    assert first.inputs[0].data.tolist() == [[0, 1, 2, 3]]
    assert second.parameters == {"custom": "yes"} and second.id == "r1"
    assert _grpc(cache, _message(0, request_id="r2"), split=split).id == "r2"  # another key
    assert len(cache) == 2


def test_grpc_every_request_gets_its_own_parameters_and_outputs() -> None:
    cache = HeaderCache()
    first = _grpc(cache, _message(0))
    first.parameters["custom"] = "changed"
    first.inputs[0].parameters["note"] = "changed"
    assert first.outputs is not None
    first.outputs.clear()
    second = _grpc(cache, _message(0))
    _same(second, _grpc_uncached(_message(0)))


@pytest.mark.parametrize(
    "raw",
    [
        [b"\x00" * 12, b"\x01\x00", b"\x03\x00\x00\x00abc"],  # INT32 bytes short
        [b"\x00" * 16, b"\x02\x00", b"\x03\x00\x00\x00abc"],  # not a BOOL
        [b"\x00" * 16, b"\x01\x00", b"\x09\x00\x00\x00abc"],  # a BYTES length past the end
        [b"\x00" * 16, b"\x01\x00"],  # one entry missing
        [b"\x00" * 16, b"\x01\x00", b"\x03\x00\x00\x00abc", b""],  # one too many
    ],
)
def test_grpc_a_repeated_header_refuses_bad_contents_as_a_first_decode_does(
    raw: list[bytes],
) -> None:
    cache = HeaderCache()
    _grpc(cache, _message(0, request_id="r9"))  # now known
    bad = _message(request_id="r9", raw=raw)
    with pytest.raises(InvalidArgument) as uncached:
        _grpc_uncached(bad)
    with pytest.raises(InvalidArgument) as cached:
        _grpc(cache, bad)
    assert str(cached.value) == str(uncached.value)
    assert len(cache) == 1
    _same(_grpc(cache, _message(5, request_id="r9")), _grpc_uncached(_message(5, request_id="r9")))


def test_grpc_typed_contents_and_regions_are_decoded_every_time() -> None:
    cache = HeaderCache()
    typed = pb.ModelInferRequest(model_name="m")
    tensor = typed.inputs.add(name="A", datatype="INT32", shape=[1, 4])
    tensor.contents.int_contents.extend([1, 2, 3, 4])
    data = typed.SerializeToString()
    assert _grpc(cache, data).inputs[0].data.tolist() == [[1, 2, 3, 4]]
    in_region = pb.ModelInferRequest(model_name="m")
    tensor = in_region.inputs.add(name="A", datatype="INT32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    in_region.inputs.add(name="B", datatype="BOOL", shape=[1, 2])
    in_region.raw_input_contents.append(b"\x01\x00")
    request = _grpc(cache, in_region.SerializeToString())
    assert request.inputs[0].shared_memory is not None
    assert request.inputs[1].data.tolist() == [[True, False]]
    assert len(cache) == 0


def test_grpc_a_reloaded_model_decodes_the_header_against_its_new_spec() -> None:
    cache = HeaderCache()
    _grpc(cache, _message(0))
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'A'"):
        _grpc(cache, _message(0), _spec(dims="[ 3 ]"))
    again = _spec()
    _same(_grpc(cache, _message(3), again), _grpc_uncached(_message(3), again))


def test_grpc_without_a_spec_nothing_is_kept() -> None:
    cache = HeaderCache()
    message, raw = grpc_codec.split_request(_message(0))
    assert decode_grpc(cache, message, None, raw).inputs[0].data.tolist() == [[0, 1, 2, 3]]
    assert len(cache) == 0


def test_grpc_parameters_in_another_order_are_the_same_header() -> None:
    cache = HeaderCache()
    names = [f"p{n}" for n in range(12)]
    for order in (names, names[::-1]):
        message = pb.ModelInferRequest.FromString(_message(0))
        for name in order:
            message.parameters[name].int64_param = 1
        _grpc(cache, message.SerializeToString())
    assert len(cache) == 1
