"""Property-based fuzzing of what parses client bytes: the REST codec (JSON header plus binary
part), the binary tensor decoder, the gRPC wire splitter and codec, and the numeric header
parsers. Whatever arrives, the answer is a request or a client error (``InvalidArgument`` and
its kin, a 4xx) -- never any other exception, which would be a 500. Bounded examples keep the
run short in CI."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.errors import InferenceServerError, InternalError
from server.generated import grpc_service_pb2 as pb
from server.http.body import parse_content_encoding, parse_content_length
from server.protocol import binary, datatypes, grpc_codec, rest_codec
from server.protocol.model_spec import ModelSpec
from server.repository.config import parse_json_config

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
SPEC = ModelSpec.from_config(
    parse_json_config(
        '{"name": "m", "max_batch_size": 8,'
        ' "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]},'
        '           {"name": "INPUT1", "data_type": "TYPE_STRING", "dims": [2]}],'
        ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}]}'
    )
)
DATATYPES = sorted(datatypes.BY_NAME)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
shapes = st.lists(
    st.one_of(st.integers(min_value=-2, max_value=6), st.just(2**62), st.text(max_size=2)),
    max_size=4,
)
inputs = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "INPUT1", "X", ""]),
        "shape": shapes,
        "datatype": st.sampled_from([*DATATYPES, "FLOAT", ""]),
    },
    optional={
        "data": json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                ["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "x"]
            ),
            json_values,
            max_size=3,
        ),
    },
)
headers = st.fixed_dictionaries(
    {"inputs": st.lists(inputs, max_size=3)},
    optional={
        "id": json_values,
        "outputs": st.lists(
            st.fixed_dictionaries({"name": json_values}, optional={"parameters": json_values}),
            max_size=2,
        ),
        "parameters": st.dictionaries(st.text(max_size=12), json_values, max_size=3),
    },
)


def _client_error_only(call: Any) -> None:
    try:
        call()
    except InternalError:
        raise
    except InferenceServerError:
        pass


@FUZZ
@given(header=st.one_of(headers, json_values), blob=st.binary(max_size=64), spec=st.booleans())
def test_rest_decode_never_fails_unexpectedly(header: Any, blob: bytes, spec: bool) -> None:
    _client_error_only(
        lambda: rest_codec.decode_request(header, memoryview(blob), "m", "", SPEC if spec else None)
    )


@FUZZ
@given(text=st.binary(max_size=200))
def test_rest_json_parsing_never_fails_unexpectedly(text: bytes) -> None:
    _client_error_only(lambda: rest_codec.parse_json(text))


@FUZZ
@given(
    blob=st.binary(max_size=64),
    datatype=st.sampled_from(DATATYPES),
    shape=st.lists(st.integers(min_value=0, max_value=5), max_size=3),
)
def test_binary_tensor_decoding(blob: bytes, datatype: str, shape: list[int]) -> None:
    def decode() -> None:
        array = binary.tensor_from_bytes(
            memoryview(blob), datatypes.BY_NAME[datatype], tuple(shape), "t", "m", None
        )
        assert array.size == int(np.prod(shape, dtype=np.int64))

    _client_error_only(decode)


@FUZZ
@given(data=st.binary(max_size=256))
def test_grpc_wire_splitting(data: bytes) -> None:
    def split() -> None:
        message, raw = grpc_codec.split_request(data)
        _client_error_only(lambda: grpc_codec.decode_request(message, SPEC, raw))

    _client_error_only(split)


@FUZZ
@given(
    tensors=st.lists(
        st.tuples(
            st.sampled_from(["INPUT0", "INPUT1", "Z"]),
            st.sampled_from([*DATATYPES, "NOPE"]),
            st.lists(st.integers(min_value=-1, max_value=5), max_size=3),
            st.binary(max_size=32),
        ),
        max_size=3,
    ),
    drop_raw=st.booleans(),
)
def test_grpc_decode(tensors: list[tuple[str, str, list[int], bytes]], drop_raw: bool) -> None:
    message = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, blob in tensors:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        if not drop_raw:
            message.raw_input_contents.append(blob)
    parsed, raw = grpc_codec.split_request(message.SerializeToString())
    _client_error_only(lambda: grpc_codec.decode_request(parsed, SPEC, raw))


@FUZZ
@given(value=st.one_of(st.none(), st.text(max_size=24)), length=st.integers(0, 2**40))
def test_numeric_headers(value: str | None, length: int) -> None:
    def parse() -> None:
        parsed = binary.parse_header_length(value, length)
        assert parsed is None or 0 <= parsed <= length
        size = parse_content_length(value)
        assert size is None or size >= 0
        parse_content_encoding(value)

    _client_error_only(parse)
    if value is not None and not value.isascii():
        return
    if value and value.isdigit() and int(value) <= length:
        assert binary.parse_header_length(value, length) == int(value)
