"""A gRPC request past its deadline is dropped while it waits for the (busy) instance."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from server.generated import grpc_service_pb2 as pb
from server.generated import grpc_service_pb2_grpc as pb_grpc
from tests.model_repos import build_napping_repository
from tests.server_process import ServerProcess, start_server


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # The busy request (256 rows) sleeps 2.6 s on the one instance, far past the late one's
    # deadline, and leaves the cores to the tests beside it.
    repository = build_napping_repository(tmp_path_factory.mktemp("slow_grpc"), 0.01)
    process = start_server(repository, args=("--log-verbose=1",))
    assert process.port is not None, process.log
    yield process
    process.stop()


def _request(rows: int, request_id: str) -> pb.ModelInferRequest:
    data = np.ones((rows, 2048), np.float32)
    return pb.ModelInferRequest(
        model_name="slow",
        id=request_id,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="INPUT0", datatype="FP32", shape=[rows, 2048]
            )
        ],
        raw_input_contents=[data.tobytes()],
    )


def test_request_past_its_deadline_is_dropped(slow_server: ServerProcess) -> None:
    with grpc.insecure_channel(slow_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        busy = stub.ModelInfer.future(_request(256, "busy"))
        time.sleep(0.1)
        with pytest.raises(grpc.RpcError) as late:
            stub.ModelInfer(_request(1, "late"), timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert busy.result(timeout=30).id == "busy"
        after = stub.ModelInfer(_request(1, "after"), timeout=30)
        assert after.id == "after"
        np.testing.assert_array_equal(
            np.frombuffer(after.raw_output_contents[0], np.float32), np.ones(2048, np.float32)
        )
    deadline = time.monotonic() + 5
    while "'late' to model" not in slow_server.log and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "request id 'late' to model 'slow' cancelled by its client" in slow_server.log
