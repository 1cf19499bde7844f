"""A ``ModelStreamInfer`` client that sends 256 MiB of requests and reads none of its replies:
the server's resident memory stays within the stream's bound (it stops reading that stream's
requests) while other calls, on the same connection and on another, are served; once the
client reads, every reply arrives, each with its own request's data."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from server import event_loop
from server.generated import grpc_service_pb2 as pb
from server.generated import grpc_service_pb2_grpc as pb_grpc
from server.grpc.stream_window import MAX_HELD_BYTES
from tests.server.grpc.helpers import SLOW_READER, settled
from tests.server_process import EXAMPLES, ServerProcess, start_server

SIZE = 2**20
COUNT = 4 * MAX_HELD_BYTES // SIZE
#: What the server may grow by: the stream's bound, plus room for the requests grpc core has
#: received but not handed over, the running requests' working copies and the allocator.
ALLOWED_GROWTH = MAX_HELD_BYTES + 64 * 2**20


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A server of its own, so that no other test's allocations blur the measurement."""
    process = start_server(EXAMPLES)
    assert process.grpc_port is not None, process.log
    yield process
    process.stop()


def _request(i: int) -> pb.ModelInferRequest:
    """1 MiB of FP32 for ``identity_fp32``, every element ``i``."""
    return pb.ModelInferRequest(
        model_name="identity_fp32",
        id=str(i),
        inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="INPUT0", datatype="FP32", shape=[1, SIZE // 4]
            )
        ],
        raw_input_contents=[np.full(SIZE // 4, i, np.float32).tobytes()],
    )


def _check(reply: pb.ModelInferResponse) -> None:
    values = np.frombuffer(reply.raw_output_contents[0], np.float32)
    assert values.size == SIZE // 4 and (values == int(reply.id)).all(), reply.id


async def _unary_ok(stub: pb_grpc.GRPCInferenceServiceStub, i: int) -> None:
    reply = await stub.ModelInfer(_request(i), timeout=10)
    assert reply.id == str(i)
    _check(reply)


def test_unread_stream_keeps_server_memory_bounded(server: ServerProcess) -> None:
    async def main() -> int:
        async with (
            grpc.aio.insecure_channel(server.grpc_url, options=SLOW_READER) as channel,
            grpc.aio.insecure_channel(server.grpc_url, options=SLOW_READER) as other,
        ):
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for i in range(8):  # warm-up: the pools and the allocator reach their working size
                await _unary_ok(stub, i)
            baseline = server.resident_bytes()
            call = stub.ModelStreamInfer()
            written = 0

            async def write() -> None:
                nonlocal written
                for i in range(COUNT):
                    await call.write(_request(i))
                    written += 1
                await call.done_writing()

            writer = asyncio.create_task(write())
            # Until the client's writes stall (or all are sent) and the server's memory stops
            # growing: on an unbounded server that is after every reply has been made.
            await settled(lambda: written, timeout=20)
            peak = await settled(lambda: server.resident_bytes() >> 20, timeout=20) << 20
            await _unary_ok(stub, 1000)
            await _unary_ok(pb_grpc.GRPCInferenceServiceStub(other), 1001)
            replies = [reply.infer_response async for reply in call]
            await asyncio.wait_for(writer, 20)
            assert sorted(int(reply.id) for reply in replies) == list(range(COUNT))
            for reply in replies:
                _check(reply)
            return peak - baseline

    grown = event_loop.run(main())
    assert grown < ALLOWED_GROWTH, (
        f"RSS grew by {grown / 2**20:.0f} MiB with {COUNT} MiB of replies unread"
    )
