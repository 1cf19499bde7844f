"""``--grpc-infer-response-compression-level``: ModelInfer and ModelStreamInfer responses are
compressed as tritonserver's are, the other methods' are not; NVIDIA's client reads them."""

from __future__ import annotations

import gzip
import queue
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from tests.server.grpc.raw_http2 import RawHttp2Client
from tests.server_process import EXAMPLES, ServerProcess, start_server

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_METADATA = "/inference.GRPCInferenceService/ModelMetadata"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES, args=("--grpc-infer-response-compression-level=medium",))
    try:
        yield process
    finally:
        assert process.stop() == 0


def _identity_request(data: np.ndarray) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32", id="z")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(data.shape))
    request.raw_input_contents.append(data.tobytes())
    return bytes(request.SerializeToString())


def _only_message(data: bytes | bytearray) -> tuple[int, bytes]:
    length = int.from_bytes(data[1:5], "big")
    assert len(data) == 5 + length
    return data[0], bytes(data[5:])


def test_infer_responses_are_compressed_with_the_algorithm_the_level_picks(
    server: ServerProcess,
) -> None:
    assert server.grpc_port is not None
    data = np.zeros((1, 2048), dtype=np.float32)  # (one frame of the raw client)
    client = RawHttp2Client(server.grpc_port)
    try:
        # medium: the middle of what the client accepts of gzip, deflate (grpc core's rule)
        for accepted, algorithm, inflate in (
            ("identity,deflate,gzip", "deflate", zlib.decompress),
            ("identity,gzip", "gzip", gzip.decompress),
        ):
            response = client.call(_INFER, _identity_request(data), ("grpc-accept-encoding", accepted))
            assert response.status == 0, response.message
            assert response.headers["grpc-encoding"] == algorithm
            flag, message = _only_message(response.data)
            assert flag == 1 and len(message) < data.nbytes
            answer = service_pb2.ModelInferResponse.FromString(inflate(message))
            assert answer.id == "z"
            assert answer.raw_output_contents[0] == data.tobytes()
        # Other methods, and clients that accept no compression, get plain messages.
        response = client.call(
            _METADATA,
            service_pb2.ModelMetadataRequest(name="identity_fp32").SerializeToString(),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
        )
        assert "grpc-encoding" not in response.headers
        assert _only_message(response.data)[0] == 0
        response = client.call(_INFER, _identity_request(data))
        assert "grpc-encoding" not in response.headers
        assert _only_message(response.data)[0] == 0
    finally:
        client.close()


def test_tritonclient_reads_compressed_responses_unary_and_streamed(
    server: ServerProcess,
) -> None:
    data = np.arange(8192, dtype=np.float32).reshape(1, 8192) % 7
    inputs = [grpcclient.InferInput("INPUT0", list(data.shape), "FP32")]
    inputs[0].set_data_from_numpy(data)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer("identity_fp32", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        replies: queue.Queue[object] = queue.Queue()
        client.start_stream(callback=lambda result, error: replies.put(error or result))
        for _ in range(3):
            client.async_stream_infer("identity_fp32", inputs)
        for _ in range(3):
            reply = replies.get(timeout=30)
            assert isinstance(reply, grpcclient.InferResult), reply
            np.testing.assert_array_equal(reply.as_numpy("OUTPUT0"), data)
        client.stop_stream()
    finally:
        client.close()
