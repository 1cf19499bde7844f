"""Channel: a message that arrives as the channel attaches can be answered through it, and
what is sent before the transport exists goes out once it does."""

from __future__ import annotations

import asyncio
import socket
import struct

import msgspec

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

    assert asyncio.run(scenario()) == [7, 42]
