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


def _key(header: bytes, model: str = "m", version: str = "1") -> tuple[str, str, bytes]:
    return (model, version, header)


def _learn(cache: HeaderCache, header: bytes, spec: ModelSpec = SPEC, model: str = "m",
           version: str = "1") -> None:
    """Decode ``header`` until a plan is kept for it: the second time it is seen."""
    key = _key(header, model, version)
    _decode(cache, header, _binary(0), spec, model, version)
    assert cache.plan(key, spec) is None
    _decode(cache, header, _binary(0), spec, model, version)
    assert cache.plan(key, spec) is not None


def test_a_header_seen_once_is_noted_and_kept_the_second_time() -> None:
    cache = HeaderCache()
    header = _header(id="r7", parameters={"priority": 2})
    first = _decode(cache, header, _binary(0))
    assert len(cache) == 0
    second = _decode(cache, header, _binary(1))
    assert len(cache) == 1
    assert cache.plan(_key(header), SPEC) is not None
    _same(first, _uncached(header, _binary(0)))
    _same(second, _uncached(header, _binary(1)))


def test_a_repeated_header_decodes_as_the_first_did_with_the_new_bytes() -> None:
    cache = HeaderCache()
    header = _header(id="r7", parameters={"priority": 2})
    _learn(cache, header)
    first = _decode(cache, header, _binary(0))
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
    requests = [_decode(cache, header, _binary(0)) for _ in range(3)]  # noted, kept, a hit
    for request in requests:
        request.parameters["priority"] = 9
        request.inputs[0].parameters["binary_data_size"] = 1
        assert request.outputs is not None
        request.outputs[0].parameters["binary_data"] = False
        request.outputs.clear()
    _same(_decode(cache, header, _binary(0)), _uncached(header, _binary(0)))


def test_nested_parameter_values_are_decoded_every_time() -> None:
    """A JSON array or object a request holds could be changed in place: never shared."""
    header = orjson.dumps({
        "inputs": [{"name": "A", "datatype": "INT32", "shape": [1, 4],
                    "parameters": {"binary_data_size": 16, "tags": ["x"]}}],
        "outputs": [{"name": "Y", "parameters": {"extra": {"k": 1}}}],
        "parameters": {"opts": {"k": 1}},
    })
    cache = HeaderCache()
    words = _binary(0)[:16]
    for _ in range(3):
        request = _decode(cache, header, words)
        assert request.parameters == {"opts": {"k": 1}}
        assert request.inputs[0].parameters["tags"] == ["x"]
        assert request.outputs is not None
        assert request.outputs[0].parameters["extra"] == {"k": 1}
        request.parameters["opts"]["k"] = 999
        request.inputs[0].parameters["tags"].append("changed")
        request.outputs[0].parameters["extra"]["k"] = 999
    assert len(cache) == 0
    for nested in ({"parameters": {"opts": [1]}},
                   {"outputs": [{"name": "Y", "parameters": {"extra": [1]}}]}):
        _decode(cache, _header(**nested), _binary(0))
        _decode(cache, _header(**nested), _binary(0))
    assert len(cache) == 0


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
    _learn(cache, header)
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
    for _ in range(3):
        with pytest.raises(InvalidArgument):
            _decode(cache, header, _binary(0))
    assert len(cache) == 0


def test_a_header_with_json_data_or_a_region_is_decoded_every_time() -> None:
    cache = HeaderCache()
    json_input = orjson.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
    ]})
    in_region = orjson.dumps({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4],
         "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}},
    ]})
    for _ in range(3):
        assert _decode(cache, json_input, b"").inputs[0].data.tolist() == [[1, 2, 3, 4]]
        assert _decode(cache, in_region, b"").inputs[0].shared_memory is not None
    assert len(cache) == 0


def test_a_long_header_is_decoded_every_time() -> None:
    cache = HeaderCache()
    header = _header(id="x" * MAX_HEADER)
    for _ in range(3):
        _same(_decode(cache, header, _binary(0)), _uncached(header, _binary(0)))
    assert len(cache) == 0


def test_a_reloaded_model_decodes_the_header_against_its_new_spec() -> None:
    cache = HeaderCache()
    header = _header()
    _learn(cache, header)
    reloaded = _spec(dims="[ 3 ]")  # the same header no longer fits
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'A'"):
        _decode(cache, header, _binary(0), reloaded)
    assert cache.plan(_key(header), SPEC) is not None  # (stays until replaced or dropped)
    again = _spec()
    _same(_decode(cache, header, _binary(3), again), _uncached(header, _binary(3), again))
    assert cache.plan(_key(header), again) is not None  # replaced at once: seen before
    assert cache.plan(_key(header), SPEC) is None


def test_model_and_version_are_part_of_the_key_and_of_every_hit() -> None:
    cache = HeaderCache()
    header = _header()
    other = _spec(name="other")
    for model, version, spec in (("m", "1", SPEC), ("m", "", SPEC), ("other", "", other)):
        _learn(cache, header, spec, model, version)
        hit = _decode(cache, header, _binary(0), spec, model=model, version=version)
        assert (hit.model_name, hit.model_version) == (model, version)
    assert len(cache) == 3


def test_the_oldest_header_is_dropped_when_full() -> None:
    cache = HeaderCache(capacity=2)
    headers = [_header(id=str(n)) for n in range(3)]
    for header in headers:
        _learn(cache, header)
    assert len(cache) == 2
    assert [cache.plan(_key(h), SPEC) is not None for h in headers] == [False, True, True]
    for n, header in enumerate(headers):
        assert _decode(cache, header, _binary(0)).id == str(n)


def test_headers_seen_once_are_noted_within_the_capacity() -> None:
    """Requests that each carry their own header fill the notes, never the plans, and a
    header in use keeps its plan."""
    cache = HeaderCache(capacity=4)
    hot = _header(id="hot")
    _learn(cache, hot)
    for n in range(50):
        _decode(cache, _header(id=str(n)), _binary(0))
        assert _decode(cache, hot, _binary(n)).inputs[0].data.tolist() == [[n, n + 1, n + 2,
                                                                           n + 3]]
    assert len(cache) == 1 and len(cache._seen) == 4
    assert cache.plan(_key(hot), SPEC) is not None


def test_a_cache_holds_at_least_one_header() -> None:
    with pytest.raises(ValueError, match="at least one"):
        HeaderCache(capacity=0)


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


def _grpc_learn(cache: HeaderCache, data: bytes, spec: ModelSpec = SPEC,
                split: bool = False) -> None:
    """Decode ``data`` until a plan is kept for its header: the second time it is seen."""
    kept = len(cache)
    _grpc(cache, data, spec, split)
    assert len(cache) == kept
    _grpc(cache, data, spec, split)
    assert len(cache) == kept + 1


@pytest.mark.parametrize("split", [False, True])
def test_grpc_a_repeated_header_decodes_as_the_first_did_with_the_new_bytes(split: bool) -> None:
    cache = HeaderCache()
    _grpc_learn(cache, _message(0, request_id="r1"), split=split)
    first = _grpc(cache, _message(0, request_id="r1"), split=split)
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
    _grpc_learn(cache, _message(0, request_id="r2"), split=split)  # another header
    assert _grpc(cache, _message(0, request_id="r2"), split=split).id == "r2"


def test_grpc_every_request_gets_its_own_parameters_and_outputs() -> None:
    cache = HeaderCache()
    for _ in range(3):  # noted, kept, a hit
        request = _grpc(cache, _message(0))
        request.parameters["custom"] = "changed"
        request.inputs[0].parameters["note"] = "changed"
        assert request.outputs is not None
        request.outputs[0].parameters["x"] = 1
        request.outputs.clear()
    _same(_grpc(cache, _message(0)), _grpc_uncached(_message(0)))


def test_grpc_a_hit_names_the_requested_version() -> None:
    cache = HeaderCache()
    for version in ("7", ""):
        message = pb.ModelInferRequest.FromString(_message(0))
        message.model_version = version
        data = message.SerializeToString()
        _grpc_learn(cache, data)
        assert _grpc(cache, data).model_version == version


def test_grpc_a_long_header_is_decoded_every_time() -> None:
    message = pb.ModelInferRequest.FromString(_message(0))
    message.id = "x" * MAX_HEADER
    data = message.SerializeToString()
    cache = HeaderCache()
    for _ in range(3):
        _same(_grpc(cache, data), _grpc_uncached(data))
    assert len(cache) == 0


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
    _grpc_learn(cache, _message(0, request_id="r9"))
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
    for _ in range(3):
        assert _grpc(cache, data).inputs[0].data.tolist() == [[1, 2, 3, 4]]
    in_region = pb.ModelInferRequest(model_name="m")
    tensor = in_region.inputs.add(name="A", datatype="INT32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    in_region.inputs.add(name="B", datatype="BOOL", shape=[1, 2])
    in_region.raw_input_contents.append(b"\x01\x00")
    for _ in range(3):
        request = _grpc(cache, in_region.SerializeToString())
        assert request.inputs[0].shared_memory is not None
        assert request.inputs[1].data.tolist() == [[True, False]]
    assert len(cache) == 0


def test_grpc_a_reloaded_model_decodes_the_header_against_its_new_spec() -> None:
    cache = HeaderCache()
    _grpc_learn(cache, _message(0))
    with pytest.raises(InvalidArgument, match="unexpected shape for input 'A'"):
        _grpc(cache, _message(0), _spec(dims="[ 3 ]"))
    again = _spec()
    _same(_grpc(cache, _message(3), again), _grpc_uncached(_message(3), again))


def test_grpc_without_a_spec_nothing_is_kept() -> None:
    cache = HeaderCache()
    for _ in range(3):
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
    assert len(cache) == 1  # kept: the second order was the same header, seen again
