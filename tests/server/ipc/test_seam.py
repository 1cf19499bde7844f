"""The seam in one process: an ExecutorService over a real DataPlane and repository, and an
ExecutorClient talking to it through a real Unix socket and real arenas. Answers must be what
the DataPlane itself gives; errors keep their class and text; cancellation, a lost executor,
malformed descriptors and model changes behave as the front end promises."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backends.onnxruntime.backend import OnnxRuntimeBackend
from scripts import make_models
from server import event_loop
from server.dataplane import DataPlane
from server.errors import InternalError, InvalidArgument, NotFound, Unavailable
from server.ipc import messages as m
from server.ipc.client import ExecutorClient
from server.ipc.service import ExecutorService
from server.ipc.tensors import Outbox
from server.memory.arena import Arena, ArenaPool
from server.protocol.datatypes import BY_NAME
from server.protocol.types import InferRequest, InputTensor, RequestedOutput
from server.repository.manager import ModelRepository
from server.settings import Settings

ARENA = 8 << 20


class Seam:
    def __init__(self, dataplane: DataPlane, service: ExecutorService, client: ExecutorClient,
                 pool: ArenaPool, serving: asyncio.Task[None], listener: socket.socket) -> None:
        self.listener = listener
        self.dataplane = dataplane
        self.service = service
        self.client = client
        self.pool = pool
        self.serving = serving


async def open_seam(root: Path, mode: str = "explicit", events: list[str] | None = None) -> Seam:
    settings = Settings(
        model_repositories=(str(root),), model_control_mode=mode, load_models=("*",)
    )
    repository = ModelRepository(
        settings, {"onnxruntime": OnnxRuntimeBackend({"intra_op_thread_count": "1"})}
    )
    await repository.load_initial(None)
    dataplane = DataPlane(settings, repository)
    dataplane.set_live(True)
    service = ExecutorService(dataplane, ARENA)
    if events is not None:
        service.on_connected = lambda arena: events.append(f"pin {arena.address}")
        service.on_released = lambda arena: events.append(f"unpin {arena.address}")
    path = str(root.parent / "control.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    serving = asyncio.create_task(service.serve(listener))
    arena = Arena.create(ARENA)
    pool = ArenaPool(arena)
    client = ExecutorClient(Outbox(arena.array, pool.allocator.allocate), pool.allocator.free)
    await client.connect(path, 0, arena.fd, arena.size)
    return Seam(dataplane, service, client, pool, serving, listener)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    make_models.save(make_models.add_sub("INT32", 16), root / "simple" / "1" / "model.onnx")
    make_models.save(make_models.identity("FP32", ["batch", -1]), root / "ident" / "1" / "model.onnx")
    return root


def run(models: Path, body: Callable[[Seam], Awaitable[None]], mode: str = "explicit") -> None:
    async def main() -> None:
        seam = await open_seam(models, mode)
        try:
            await body(seam)
        finally:
            seam.client.close()
            seam.service.close()
            seam.serving.cancel()
            seam.listener.close()
            await seam.dataplane._repository.close()
    event_loop.run(main())


def add_sub_request(n: int = 16, request_id: str = "r") -> InferRequest:
    int32 = BY_NAME["INT32"]
    a = np.arange(n, dtype=np.int32).reshape(1, n)
    b = np.ones((1, n), dtype=np.int32)
    return InferRequest(
        "simple", "",
        [InputTensor("INPUT0", int32, a.shape, a), InputTensor("INPUT1", int32, b.shape, b)],
        id=request_id,
    )


def ident_request(rows: int, cols: int, data: np.ndarray | None = None) -> InferRequest:
    fp32 = BY_NAME["FP32"]
    if data is None:
        data = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
    return InferRequest("ident", "", [InputTensor("INPUT0", fp32, data.shape, data)])


def test_small_request_is_answered_as_in_process(models: Path) -> None:
    async def body(seam: Seam) -> None:
        direct = await seam.dataplane.infer(add_sub_request())
        remote = await seam.client.infer(add_sub_request())
        assert remote.model_name == direct.model_name and remote.model_version == "1"
        assert remote.id == "r"
        for a, b in zip(direct.outputs, remote.outputs, strict=True):
            assert a.name == b.name and a.shape == b.shape
            assert np.array_equal(a.data, b.data)
    run(models, body)


def test_requests_held_reach_the_executor_together_when_the_hold_ends(models: Path) -> None:
    async def body(seam: Seam) -> None:
        with seam.client.requests_held():
            tasks = [asyncio.create_task(seam.client.infer(add_sub_request(request_id=str(i))))
                     for i in range(3)]
            await asyncio.sleep(0.05)
            assert not any(task.done() for task in tasks)  # nothing was sent yet
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        expected = (await seam.dataplane.infer(add_sub_request())).outputs
        for index, answer in enumerate(answers):
            assert answer.id == str(index)
            for a, b in zip(expected, answer.outputs, strict=True):
                assert a.name == b.name and np.array_equal(a.data, b.data)
    run(models, body)


def test_large_tensors_travel_through_the_arenas_and_are_freed(models: Path) -> None:
    async def body(seam: Seam) -> None:
        # 2 MiB: over OFF_LOOP_BYTES, so both copies into the arenas run on threads.
        data = np.random.default_rng(1).random((4, 131072), dtype=np.float32)
        # In the arena already (as an HTTP body would be): sent by offset, not copied.
        block = seam.pool.acquire(data.nbytes)
        inside = np.frombuffer(block.view, dtype=np.float32).reshape(data.shape)
        inside[...] = data
        response = await seam.client.infer(ident_request(4, 131072, inside))
        assert np.array_equal(response.outputs[0].data, data)
        assert response.on_release is not None  # a view of the executor's output arena
        response.release()
        block.release()
        # Not in the arena (a gRPC message's bytes): copied into a block, freed on the answer.
        response = await seam.client.infer(ident_request(4, 131072, data.copy()))
        assert np.array_equal(response.outputs[0].data, data)
        response.release()
        assert seam.pool.bytes_in_use == 0
        await asyncio.sleep(0.05)  # the releases reach the executor
        (connection,) = seam.service._connections
        assert connection.allocator.bytes_in_use == 0
    run(models, body)


def test_a_large_output_is_written_by_the_model_into_the_executor_arena(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(seam: Seam) -> None:
        data = np.random.default_rng(2).random((4, 131072), dtype=np.float32)
        block = seam.pool.acquire(data.nbytes)
        inside = np.frombuffer(block.view, dtype=np.float32).reshape(data.shape)
        inside[...] = data

        def no_copy(self: Outbox, data: np.ndarray) -> int | None:
            raise AssertionError(f"{data.nbytes} bytes copied into an arena")

        with monkeypatch.context() as patch:
            patch.setattr(Outbox, "store", no_copy)
            response = await seam.client.infer(ident_request(4, 131072, inside))
        assert np.array_equal(response.outputs[0].data, data)
        assert response.on_release is not None
        response.release()
        block.release()
        await asyncio.sleep(0.05)  # the release reaches the executor
        (connection,) = seam.service._connections
        assert connection.allocator.bytes_in_use == 0
    run(models, body)


def test_blocks_lent_for_outputs_the_answer_does_not_carry_are_freed(models: Path) -> None:
    async def body(seam: Seam) -> None:
        request = ident_request(4, 131072)
        request.outputs = [RequestedOutput("OUTPUT0", {"classification": 2})]
        response = await seam.client.infer(request)
        assert response.outputs[0].datatype.name == "BYTES"  # the model's output replaced
        assert response.outputs[0].shape == (4, 2)
        response.release()
        await asyncio.sleep(0.05)
        (connection,) = seam.service._connections
        assert connection.allocator.bytes_in_use == 0
    run(models, body)


def test_errors_keep_their_class_and_text(models: Path) -> None:
    async def body(seam: Seam) -> None:
        call: Callable[[Any], Awaitable[object]]
        for call in (
            lambda plane: plane.infer(InferRequest("nope", "", [])),
            lambda plane: plane.model_metadata("nope", ""),
            lambda plane: plane.model_config("simple", "7"),
            lambda plane: plane.infer(add_sub_request(8)),  # wrong shape
        ):
            with pytest.raises(Exception) as direct:
                await call(seam.dataplane)
            with pytest.raises(Exception) as remote:
                await call(seam.client)
            assert type(remote.value) is type(direct.value)
            assert str(remote.value) == str(direct.value)
            assert isinstance(remote.value, (NotFound, InvalidArgument))
    run(models, body)


def test_control_calls_answer_with_the_executor_state(models: Path) -> None:
    async def body(seam: Seam) -> None:
        client, plane = seam.client, seam.dataplane
        assert await client.ready() and client.live()
        assert await client.server_metadata() == await plane.server_metadata()
        assert await client.model_metadata("simple", "") == await plane.model_metadata("simple", "")
        assert await client.model_config("simple", "") == await plane.model_config("simple", "")
        assert await client.repository_index(False) == await plane.repository_index(False)
        await client.model_spec("simple", "")  # cached, as the transports' decoding does
        assert client._specs
        await client.infer(add_sub_request())
        stats = await client.statistics("simple", "")
        assert stats == await plane.statistics("simple", "")
        assert stats.model_stats[0].inference_count == 1
        await client.unload_model("simple")
        assert not await client.model_ready("simple", "")
        assert not client._specs  # dropped before the unload returned
        with pytest.raises((NotFound, Unavailable)):
            await client.infer(add_sub_request())
        await client.load_model("simple", None, {})
        assert (await client.infer(add_sub_request())).outputs
    run(models, body)


def hold(seam: Seam, model: str) -> asyncio.Event:
    """Make ``model``'s executions wait until the returned event is set."""
    served = seam.dataplane._repository.version(model, "")
    assert served.scheduler is not None
    gate = asyncio.Event()
    real = served.scheduler.execute

    async def slow(job: Any) -> Any:
        await gate.wait()
        return await real(job)

    served.scheduler.execute = slow  # type: ignore[method-assign]
    return gate


def test_a_cancelled_request_never_runs_and_its_blocks_are_freed(models: Path) -> None:
    async def body(seam: Seam) -> None:
        # Hold the only instance busy, then queue a request and give it up.
        gate = hold(seam, "ident")
        data = np.ones((4, 65536), dtype=np.float32)
        task = asyncio.create_task(seam.client.infer(ident_request(4, 65536, data)))
        await asyncio.sleep(0.1)
        assert seam.pool.bytes_in_use > 0  # the copy of its input
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seam.pool.bytes_in_use == 0
        stats = await seam.client.statistics("ident", "")
        assert stats.model_stats[0].inference_stats.fail.count == 1
        gate.set()
    run(models, body)


async def cancelled_twice(task: asyncio.Task[Any], waiting: Callable[[], int]) -> int:
    """Cancel ``task``, and again once it has sent Cancel and waits for the executor's answer;
    how many requests were ``waiting()`` when it ended."""
    at_the_end: list[int] = []
    task.add_done_callback(lambda _: at_the_end.append(waiting()))
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return at_the_end[0]


def test_a_request_cancelled_twice_holds_its_blocks_until_the_executor_has_answered(
    models: Path,
) -> None:
    """A second cancellation while the front end waits for the executor's final answer to a
    dropped request does not end the wait: the blocks (which the executor may be reading)
    are freed only once that answer is in."""
    async def body(seam: Seam) -> None:
        gate = hold(seam, "ident")
        data = np.ones((4, 65536), dtype=np.float32)
        task = asyncio.create_task(seam.client.infer(ident_request(4, 65536, data)))
        await asyncio.sleep(0.1)
        # it ended only after the executor's answer
        assert await cancelled_twice(task, lambda: len(seam.client._pending)) == 0
        assert seam.pool.bytes_in_use == 0
        gate.set()
        assert (await seam.client.infer(add_sub_request())).outputs
    run(models, body)


def test_a_stream_given_up_ends_only_once_the_executor_has_answered(models: Path) -> None:
    """Its inputs may lie in a block its caller frees as soon as the stream ends (a pooled
    gRPC message): it ends, through a second cancellation too, only once the executor's last
    reply is in."""
    async def body(seam: Seam) -> None:
        gate = hold(seam, "ident")
        block = seam.pool.acquire(4 * 65536 * 4)  # where the transport received the message
        data = np.frombuffer(block.view, dtype=np.float32).reshape(4, 65536)

        async def consume() -> None:
            async for _ in seam.client.infer_stream(ident_request(4, 65536, data)):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        # it ended only after the executor's answer
        assert await cancelled_twice(task, lambda: len(seam.client._streams)) == 0
        block.release()
        assert seam.pool.bytes_in_use == 0
        stats = await seam.client.statistics("ident", "")
        assert stats.model_stats[0].inference_stats.fail.count == 1  # it never ran
        gate.set()
        assert (await seam.client.infer(add_sub_request())).outputs
    run(models, body)


def test_a_request_cancelled_just_as_its_answer_arrives_frees_the_answers_blocks(
    models: Path,
) -> None:
    """The executor's answer is in (its outputs in the executor's arena) but the caller is
    cancelled before it resumes: nobody will read the answer, so its blocks are released."""
    async def body(seam: Seam) -> None:
        client = seam.client
        data = np.ones((4, 65536), dtype=np.float32)  # 1 MiB out: in the executor's arena
        task = asyncio.create_task(client.infer(ident_request(4, 65536, data)))
        deliver = client._on_message

        def then_cancel(message: Any) -> None:
            deliver(message)
            if isinstance(message, m.Done):
                task.cancel()  # in the same step: the caller has not resumed yet

        assert client._channel is not None
        client._channel._on_message = then_cancel  # what the channel hands each message to
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
        (connection,) = seam.service._connections
        assert connection.allocator.bytes_in_use == 0
        assert seam.pool.bytes_in_use == 0
        client._channel._on_message = deliver
        assert (await client.infer(add_sub_request())).outputs  # still serving
    run(models, body)


def test_executor_gone_fails_pending_requests_at_once(models: Path) -> None:
    async def body(seam: Seam) -> None:
        served = seam.dataplane._repository.version("simple", "")
        assert served.scheduler is not None

        async def never(job: Any) -> Any:
            await asyncio.Event().wait()

        served.scheduler.execute = never  # type: ignore[method-assign]
        task = asyncio.create_task(seam.client.infer(add_sub_request()))
        await asyncio.sleep(0.05)
        seam.service.close()
        with pytest.raises(Unavailable):
            await asyncio.wait_for(task, 2)
        assert not seam.client.live() and not await seam.client.ready()
        with pytest.raises(Unavailable):
            await seam.client.model_metadata("simple", "")
    run(models, body)


def test_a_malformed_descriptor_fails_that_request_alone(models: Path) -> None:
    async def body(seam: Seam) -> None:
        client = seam.client
        bad = [
            m.Tensor("INPUT0", "INT32", [1, 16], offset=ARENA - 8, nbytes=64),  # past the end
            m.Tensor("INPUT0", "INT32", [1, 16], inline=b"short"),
            m.Tensor("INPUT0", "NOPE", [1, 16], inline=b"x" * 64),
            m.Tensor("INPUT0", "INT32", [-1, 16], inline=b"x" * 64),
        ]
        for tensor in bad:
            message = m.Infer(10_000, "simple", "", None, {}, [tensor], None)
            reply = await client._send(message, message.id)
            assert isinstance(reply, m.Failed) and reply.error == InternalError.__name__
        assert (await client.infer(add_sub_request())).outputs  # still serving
    run(models, body)


def test_thousands_of_refused_and_abandoned_requests_leave_no_arena_space(models: Path) -> None:
    async def body(seam: Seam) -> None:
        big = np.ones((1, 8192), dtype=np.float32)  # over INLINE_BYTES: copied into the arena
        for round_ in range(20):
            tasks = [asyncio.create_task(seam.client.infer(ident_request(1, 8192, big)))
                     for _ in range(50)]
            tasks += [asyncio.create_task(seam.client.infer(
                InferRequest("ident", "", [InputTensor("WRONG", BY_NAME["FP32"], big.shape, big)])
            )) for _ in range(50)]
            await asyncio.sleep(0)
            for task in tasks[round_ % 3 :: 3]:
                task.cancel()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if not isinstance(result, BaseException):
                    result.release()
        assert seam.pool.bytes_in_use == 0
        await asyncio.sleep(0.1)
        (connection,) = seam.service._connections
        assert connection.allocator.bytes_in_use == 0
        assert not connection.tasks
    run(models, body)


def test_a_front_ends_arenas_are_pinned_on_connect_and_unpinned_once_it_is_gone(
    models: Path,
) -> None:
    """Its request arena (as mapped here) and the result arena made for it: a GPU's copies
    from the one and into the other are DMA."""
    async def main() -> None:
        events: list[str] = []
        seam = await open_seam(models, events=events)
        try:
            await seam.client.infer(add_sub_request())
            (connection,) = seam.service._connections
            pinned = [f"pin {connection.peer.address}", f"pin {connection.out.address}"]
            assert events == pinned
            seam.client.close()
            for _ in range(100):
                if len(events) == 4:
                    break
                await asyncio.sleep(0.01)
            assert events == [*pinned, *(e.replace("pin", "unpin") for e in pinned)]
        finally:
            seam.service.close()
            seam.serving.cancel()
            seam.listener.close()
            await seam.dataplane._repository.close()
    event_loop.run(main())


def test_a_failed_introduction_leaks_nothing_and_others_still_connect(
    models: Path, tmp_path: Path
) -> None:
    """A peer whose first message is garbage (with an fd, or an arena of a wrong size) is
    dropped: the fd it sent is closed, and front ends introducing themselves properly are
    served."""
    import os

    from server.ipc.channel import send_hello

    async def body(seam: Seam) -> None:
        loop = asyncio.get_running_loop()
        path = str(models.parent / "control.sock")
        before = len(os.listdir("/proc/self/fd"))
        for hello in (b"garbage", m.encoder().encode(m.Hello("frontend", 9, 12345))):
            read_end, write_end = os.pipe()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await loop.run_in_executor(None, sock.connect, path)
            send_hello(sock, hello, read_end)
            os.close(read_end)
            os.close(write_end)
            assert await loop.run_in_executor(None, sock.recv, 1) == b""  # dropped
            sock.close()
        for _ in range(100):
            if len(os.listdir("/proc/self/fd")) <= before:
                break
            await asyncio.sleep(0.01)
        assert len(os.listdir("/proc/self/fd")) <= before
        assert (await seam.client.infer(add_sub_request())).outputs
    run(models, body)


@pytest.mark.usefixtures("root_logging")
def test_log_settings_are_applied_and_acknowledged_by_the_front_end(models: Path) -> None:
    """The executor's answer comes after the front end has applied the change: well within
    the acknowledgement timeout."""
    async def body(seam: Seam) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        now = await seam.client.log_settings({"log_verbose_level": 2, "log_format": "ISO8601"})
        assert loop.time() - started < 2.0
        assert now == await seam.client.log_settings({})
        assert now["log_verbose_level"] == 2 and now["log_format"] == "ISO8601"
    run(models, body)
