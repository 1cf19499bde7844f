"""How large each arena of the split layout is.

The pinned pool budget (``--pinned-memory-pool-byte-size``, Triton's 256 MiB for the whole
server) is shared out among the front ends, as Triton's one pool serves all its connections;
but a front end's request arena always holds at least one body of ``--http-max-input-size``,
so every acceptable body can be received. Results come back through the executor's arena of
each connection, half a front end's share: a result that does not fit now travels through the
socket instead (slower, never refused).
"""

from __future__ import annotations

from server.memory.host_pool import size_class
from server.settings import HTTP_CHUNK_BYTES, Settings

_MIN_OUTPUT_ARENA = 16 << 20


def request_arena_bytes(settings: Settings, frontends: int) -> int:
    share = settings.pinned_memory_pool_byte_size // max(1, frontends)
    return max(share, size_class(settings.http_max_input_size + HTTP_CHUNK_BYTES))


def output_arena_bytes(settings: Settings, frontends: int) -> int:
    share = settings.pinned_memory_pool_byte_size // max(1, frontends)
    return max(share // 2, _MIN_OUTPUT_ARENA)
