"""``--grpc-restricted-protocol``: every method of the inference and health services is in
Triton's category (``src/grpc/grpc_server.cc``); a call of a restricted one without the
``triton-grpc-protocol-<key>`` metadata is UNAVAILABLE "This protocol is restricted, expecting
header '...'" before its request is used, a stream ends before its first request; with the
metadata it is served (triton-facts §7.3, Triton's ``qa/L0_grpc`` RestrictedProtocolTest)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from server import event_loop, restricted
from server.dataplane import DataPlane
from server.generated import grpc_service_pb2 as pb
from server.grpc.restriction import METHOD_CATEGORIES
from server.grpc.server import GrpcServer
from server.settings import Settings
from tests.server.grpc.helpers import simple_inputs
from tests.server_process import EXAMPLES, ServerProcess, start_server

PREFIX = "triton-grpc-protocol-"
INFER = {PREFIX + "infer-key": "infer-value"}
ADMIN = {PREFIX + "admin-key": "admin-value"}
INFER_TEXT = "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"


def test_every_method_has_its_category() -> None:
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    names = {f"/{service.full_name}/{method.name}" for method in service.methods}
    health = {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
    assert set(METHOD_CATEGORIES) == names | health
    assert set(METHOD_CATEGORIES.values()) == set(restricted.CATEGORIES)
    expected = {
        "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
        "ServerMetadata": "metadata", "ModelMetadata": "metadata",
        "ModelInfer": "inference", "ModelStreamInfer": "inference",
        "ModelConfig": "model-config", "ModelStatistics": "statistics",
        "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
        "RepositoryModelUnload": "model-repository",
        "TraceSetting": "trace", "LogSettings": "logging",
    }
    for name, category in expected.items():
        assert METHOD_CATEGORIES[f"/{service.full_name}/{name}"] == category
    shm = [m for m in names if "SharedMemory" in m]
    assert len(shm) == 6 and {METHOD_CATEGORIES[m] for m in shm} == {"shared-memory"}


async def _refused(call: Any) -> str | None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    details: str | None = info.value.details()
    return details


def test_every_kind_of_call_in_process() -> None:
    """Unary, server-streaming (health Watch) and bidirectional (ModelStreamInfer) calls."""

    async def main() -> None:
        plane = DataPlane(Settings(strict_readiness=False), None)  # type: ignore[arg-type]
        plane.set_live(True)
        table = {
            "health": (PREFIX + "k", "v"),
            "inference": (PREFIX + "infer-key", "infer-value"),
        }
        server = GrpcServer(plane, restrictions=restricted.for_grpc(table))
        port = server.bind("127.0.0.1", 0)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                await _scenario(channel)
        finally:
            await server.stop(0)

    event_loop.run(main())


async def _scenario(channel: grpc.aio.Channel) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    text = "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    live = service_pb2.ServerLiveRequest()
    assert await _refused(stub.ServerLive(live)) == text
    assert await _refused(stub.ServerLive(live, metadata=((PREFIX + "k", "w"),))) == text
    assert await _refused(stub.ServerLive(live, metadata=(("k", "v"),))) == text
    assert (await stub.ServerLive(live, metadata=((PREFIX + "k", "v"),))).live
    check = health_pb2.HealthCheckRequest()
    # types-grpcio-health-checking declares HealthStub without its Check and Watch.
    assert await _refused(health.Check(check)) == text  # type: ignore[attr-defined]
    answer = await health.Check(  # type: ignore[attr-defined]
        check, metadata=((PREFIX + "k", "v"),)
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    watch = health.Watch(check)  # type: ignore[attr-defined]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await watch.read()
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, text)
    # A stream is ended before its first request is read.
    sent = asyncio.Event()

    async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
        sent.set()
        yield service_pb2.ModelInferRequest(model_name="m")

    stream = stub.ModelStreamInfer(requests())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stream.read()
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, INFER_TEXT)
    # Categories not restricted are served without any metadata.
    assert (await stub.ServerMetadata(service_pb2.ServerMetadataRequest())).name == "triton"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(
        EXAMPLES,
        args=(
            "--grpc-restricted-protocol=model-repository:admin-key=admin-value",
            "--grpc-restricted-protocol=inference,health:infer-key=infer-value",
        ),
    )
    assert process.grpc_port is not None, process.log
    yield process
    assert process.stop() == 0, process.log


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def test_sanity(client: grpcclient.InferenceServerClient) -> None:
    """Categories not restricted are open, with or without a header."""
    client.get_inference_statistics("simple")
    client.get_inference_statistics("simple", headers=INFER)
    assert client.get_server_metadata().name == "triton"
    assert client.get_model_config("simple").config.name == "simple"


def test_model_repository(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="This protocol is restricted") as info:
        client.unload_model("simple", headers=INFER)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "expecting header 'triton-grpc-protocol-admin-key'" in info.value.message()
    with pytest.raises(
        InferenceServerException, match="explicit model load / unload is not allowed"
    ):
        client.unload_model("simple", headers=ADMIN)
    assert client.is_server_live(headers=INFER)
    assert client.is_model_ready("simple", headers=INFER)  # the refusals unloaded nothing


def test_health(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.is_server_live()
    assert info.value.message() == INFER_TEXT
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        client.is_model_ready("simple", headers=ADMIN)
    assert client.is_server_live(headers=INFER)
    assert client.is_server_ready(headers=INFER)
    assert client.is_model_ready("simple", headers=INFER)


def test_infer(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", simple_inputs(), headers={"test": "1"})
    assert info.value.message() == INFER_TEXT
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    result = client.infer("simple", simple_inputs(), headers=INFER)
    assert (result.as_numpy("OUTPUT0") == 2).all()


def test_stream_infer(client: grpcclient.InferenceServerClient) -> None:
    """Without the header the stream ends as soon as it opens: the callback gets the refusal
    and requests find the stream gone, as with Triton (the first one too, when the refusal
    has arrived before it)."""
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        client.async_stream_infer("simple", simple_inputs())
    except InferenceServerException as early:
        assert "The stream is no longer in valid state" in early.message()
    error = results.get(timeout=30)
    assert isinstance(error, InferenceServerException)
    assert "This protocol is restricted" in error.message()
    with pytest.raises(InferenceServerException, match="The stream is no longer in valid state"):
        client.async_stream_infer("simple", simple_inputs())
    client.stop_stream()
    client.start_stream(
        callback=lambda result, error: results.put(error or result), headers=INFER
    )
    client.async_stream_infer("simple", simple_inputs(), request_id="1")
    result = results.get(timeout=30)
    assert not isinstance(result, InferenceServerException), result
    assert (result.as_numpy("OUTPUT0") == 2).all()
    client.stop_stream()
