"""Checking that objects are freed by their reference counts alone, with the collector off."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Collection, Iterator
from contextlib import contextmanager


@contextmanager
def collector_off() -> Iterator[None]:
    """Collect once, then keep the collector off until the block ends: what is not freed
    meanwhile is held by a reference cycle (or by a live reference)."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def alive(*kinds: type) -> tuple[int, ...]:
    """How many objects of each of ``kinds`` exist now."""
    objects = gc.get_objects()
    return tuple(sum(isinstance(o, kind) for o in objects) for kind in kinds)


async def until_empty(connections: Collection[object], seconds: float = 5.0) -> None:
    """Wait until a server has seen its last connection go (``connections`` is its live set)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while connections and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert not connections, connections
