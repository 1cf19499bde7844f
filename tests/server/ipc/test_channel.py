"""Channel: a message that arrives as the channel attaches can be answered through it, and
what is sent before the transport exists goes out once it does; a gathering channel writes
what tasks send in one pass of the loop at once, what it answers while it handles one read
at once, and what other callbacks send at once; what is sent while held goes out in one
write when the last hold ends."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import msgspec
import pytest

from server import event_loop
from server.ipc.channel import Channel

_LENGTH = struct.Struct("<I")


def _frame(value: int) -> bytes:
    body = msgspec.msgpack.encode(value)
    return _LENGTH.pack(len(body)) + body


async def _read_frames(sock: socket.socket, count: int) -> list[int]:
    loop = asyncio.get_running_loop()
    data = b""
    values: list[int] = []
    while len(values) < count:
        data += await asyncio.wait_for(loop.sock_recv(sock, 4096), 5)
        while len(data) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(data)
            if len(data) < _LENGTH.size + length:
                break
            values.append(msgspec.msgpack.decode(data[_LENGTH.size : _LENGTH.size + length]))
            data = data[_LENGTH.size + length :]
    return values


def test_a_message_waiting_on_the_socket_is_answered_and_early_sends_are_kept() -> None:
    async def scenario() -> list[int]:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        channel: Channel[int] = Channel(
            msgspec.msgpack.Decoder(int), lambda value: channel.send(value + 1), lambda: None
        )
        channel.send(7)  # before the transport exists
        peer.sendall(_frame(41))  # waiting before the channel reads
        await channel.attach(ours)
        try:
            return await _read_frames(peer, 2)
        finally:
            channel.close()
            peer.close()

    assert event_loop.run(scenario()) == [7, 42]


class _Recorder(asyncio.Transport):
    """Keeps each write call's bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def _attached(gather: bool) -> tuple[Channel[int], _Recorder]:
    channel: Channel[int] = Channel(
        msgspec.msgpack.Decoder(int), lambda value: None, lambda: None, gather=gather
    )
    transport = _Recorder()
    channel.connection_made(transport)
    return channel, transport


async def _send_from_tasks(channel: Channel[int], values: list[int]) -> None:
    """Each value sent by its own task, all of them resumed in one pass (a batch's answers)."""
    released = asyncio.Event()

    async def answer(value: int) -> None:
        await released.wait()
        channel.send(value)

    tasks = [asyncio.create_task(answer(value)) for value in values]
    await asyncio.sleep(0)  # every task waits on the event
    released.set()
    await asyncio.gather(*tasks)


@pytest.mark.parametrize("gather", [True, False])
def test_what_tasks_send_in_one_pass_is_one_write_when_gathering(gather: bool) -> None:
    async def scenario() -> list[bytes]:
        channel, transport = _attached(gather)
        await _send_from_tasks(channel, [1, 2, 3])
        await asyncio.sleep(0)  # the end of the pass
        return transport.writes

    frames = [_frame(1), _frame(2), _frame(3)]
    assert event_loop.run(scenario()) == ([b"".join(frames)] if gather else frames)


def test_a_callback_send_is_written_at_once_and_keeps_the_order() -> None:
    async def scenario() -> list[list[bytes]]:
        channel, transport = _attached(gather=True)
        seen: list[list[bytes]] = []

        def inline_answer() -> None:  # no task: as a request answered while it is read
            channel.send(1)
            seen.append(list(transport.writes))

        asyncio.get_running_loop().call_soon(inline_answer)
        await asyncio.sleep(0)

        async def answer() -> None:
            channel.send(2)  # gathered

        task = asyncio.create_task(answer())
        # a callback of the same pass, after the task's step: its message goes behind 2
        asyncio.get_running_loop().call_soon(channel.send, 3)
        await task
        await asyncio.sleep(0)
        seen.append(transport.writes)
        return seen

    before, after = event_loop.run(scenario())
    assert before == [_frame(1)]
    assert b"".join(after) == _frame(1) + _frame(2) + _frame(3)


def test_gathered_messages_go_out_before_the_channel_closes() -> None:
    async def scenario() -> _Recorder:
        channel, transport = _attached(gather=True)

        async def answer_and_close() -> None:
            channel.send(5)
            channel.close()

        await asyncio.create_task(answer_and_close())
        return transport

    transport = event_loop.run(scenario())
    assert transport.writes == [_frame(5)] and transport.closed


def test_what_is_sent_while_held_goes_out_in_one_write_when_the_last_hold_ends() -> None:
    async def scenario() -> list[list[bytes]]:
        channel, transport = _attached(gather=False)
        seen = []
        channel.hold()
        channel.send(1)
        channel.hold()  # (nested)
        channel.send(2)
        channel.release()
        seen.append(list(transport.writes))
        channel.send(3)
        channel.release()
        seen.append(list(transport.writes))
        channel.hold()
        channel.release()  # nothing held: nothing written
        channel.send(4)  # not held: at once
        seen.append(list(transport.writes))
        return seen

    inner, outer, after = event_loop.run(scenario())
    assert inner == []
    assert outer == [_frame(1) + _frame(2) + _frame(3)]
    assert after == [*outer, _frame(4)]


@pytest.mark.parametrize("gather", [True, False])
def test_the_answers_to_one_read_are_one_write_when_gathering(gather: bool) -> None:
    async def scenario() -> list[bytes]:
        transport = _Recorder()
        channel: Channel[int] = Channel(
            msgspec.msgpack.Decoder(int), lambda value: channel.send(value + 1), lambda: None,
            gather=gather,
        )
        channel.connection_made(transport)
        data = _frame(1) + _frame(2) + _frame(3)

        def read() -> None:  # three requests in one read, answered inline (no task)
            channel.get_buffer(-1)[: len(data)] = data
            channel.buffer_updated(len(data))

        asyncio.get_running_loop().call_soon(read)
        await asyncio.sleep(0)
        return transport.writes

    answers = [_frame(2), _frame(3), _frame(4)]
    assert event_loop.run(scenario()) == ([b"".join(answers)] if gather else answers)
