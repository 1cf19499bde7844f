"""The messages between a front end and the executor, as msgspec structs packed with msgpack
(array-like: field names never travel). One union per direction, tagged by a small integer.

A tensor travels as a ``Tensor`` descriptor: its bytes inline (small tensors, BYTES), at an
offset of the sender's arena (``offset`` ≥ 0), or in a client's shared memory region (``shm``).
"""

from __future__ import annotations

from typing import Any

import msgspec

#: Tensors up to this size travel inside the message; larger ones stay in an arena.
INLINE_BYTES = 1 << 14


class Tensor(msgspec.Struct, array_like=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}
    inline: bytes | None = None
    offset: int = -1
    nbytes: int = 0
    #: (region, offset, byte_size) of a client's shared memory region
    shm: tuple[str, int, int] | None = None


class Wanted(msgspec.Struct, array_like=True, omit_defaults=True):
    """An output the client asked for."""

    name: str
    parameters: dict[str, Any] = {}
    shm: tuple[str, int, int] | None = None


# --- front end -> executor ------------------------------------------------------------------


class Infer(msgspec.Struct, array_like=True, tag=1):
    """A request; with ``stream``, answered by ``Streamed`` replies (a decoupled model's
    many), the last flagged final, instead of one ``Done``."""

    id: int
    model: str
    version: str
    request_id: str | None
    parameters: dict[str, Any]
    inputs: list[Tensor]
    outputs: list[Wanted] | None
    stream: bool = False
    #: ``server.tracing.context.TraceContext.as_tuple()``: the transport's side of a trace
    trace: tuple[str, int, int, str] | None = None


class Cancel(msgspec.Struct, array_like=True, tag=2):
    """The client of request ``id`` went away: stop it if it has not run yet."""

    id: int


class Release(msgspec.Struct, array_like=True, tag=3):
    """Output blocks of the executor's arena that the front end no longer reads."""

    offsets: list[int]


class Call(msgspec.Struct, array_like=True, tag=4):
    """A control call: ``method`` of the executor's data plane with ``args``."""

    id: int
    method: str
    args: list[Any]


class Acknowledge(msgspec.Struct, array_like=True, tag=5):
    """The front end has dropped its cached model specs (answer to ``Invalidate``), or
    applied new log settings (answer to ``LogSettings``)."""

    id: int


class Sent(msgspec.Struct, array_like=True, tag=6):
    """The traced request ``id``'s response (``Done.traced``) was handed to the transport at
    ``start`` and written by ``end`` (0, 0: given up unsent)."""

    id: int
    start: int
    end: int


ToExecutor = Infer | Cancel | Release | Call | Acknowledge | Sent


# --- executor -> front end ------------------------------------------------------------------


class Done(msgspec.Struct, array_like=True, tag=10):
    id: int
    model_name: str
    model_version: str
    response_id: str | None
    parameters: dict[str, Any]
    outputs: list[Tensor]
    #: the request is traced: answer with ``Sent`` once the response is written
    traced: bool = False


class Failed(msgspec.Struct, array_like=True, tag=11):
    """Request or call ``id`` failed with ``error`` (a class of ``server.errors``)."""

    id: int
    error: str
    message: str


class Returned(msgspec.Struct, array_like=True, tag=12):
    id: int
    value: Any


class Invalidate(msgspec.Struct, array_like=True, tag=13):
    """Models were loaded or unloaded: drop cached specs, then ``Acknowledge``."""

    id: int


class Streamed(msgspec.Struct, array_like=True, tag=14):
    """One reply to a streamed request ``id``: a response (``done``), an error (``error``
    names its class in ``server.errors``), or neither (a flags-only final). After the one
    with ``final``, or a ``Failed``, nothing more comes for ``id``."""

    id: int
    final: bool
    model_version: str
    done: Done | None = None
    error: str | None = None
    message: str = ""


class LogSettings(msgspec.Struct, array_like=True, tag=15):
    """The log settings changed (the logging extension): apply them, then ``Acknowledge``."""

    id: int
    settings: dict[str, Any]


ToFrontEnd = Done | Failed | Returned | Invalidate | Streamed | LogSettings


class Hello(msgspec.Struct, array_like=True):
    """The first message on a connection, sent with the sender's arena as an fd."""

    role: str
    index: int
    arena_bytes: int


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def decode_hello(body: bytes) -> Hello:
    return msgspec.msgpack.decode(body, type=Hello)


#: What a malformed introduction raises.
DecodeError = msgspec.DecodeError


def to_executor_decoder() -> msgspec.msgpack.Decoder[ToExecutor]:
    return msgspec.msgpack.Decoder(ToExecutor)


def to_front_end_decoder() -> msgspec.msgpack.Decoder[ToFrontEnd]:
    return msgspec.msgpack.Decoder(ToFrontEnd)
