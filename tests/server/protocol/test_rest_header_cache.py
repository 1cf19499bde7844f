"""Unit tests for server.protocol.rest_header_cache: a repeated header, decoded once."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.protocol.model_spec import ModelSpec
from server.protocol.rest_codec import decode_request, parse_json
from server.protocol.rest_header_cache import MAX_HEADER, HeaderCache
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
    return cache.decode(memoryview(header), memoryview(binary), model, version, spec, 1 << 20)


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
