"""Small helpers shared by the gRPC tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import tritonclient.grpc as grpcclient

#: Channel options of a client whose receive window stays at 64 KiB while it reads nothing
#: (no BDP probing to widen it), and which takes replies of any size once it reads.
SLOW_READER = (
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 2**16),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)


async def settled(count: Callable[[], int], timeout: float = 10.0, quiet: float = 0.3) -> int:
    """``count()`` once it has not changed for ``quiet`` seconds (or ``timeout`` has passed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = -1
    while (now := count()) != last and loop.time() < deadline:
        last = now
        await asyncio.sleep(quiet)
    return now


def simple_inputs() -> list[grpcclient.InferInput]:
    """INPUT0 and INPUT1 of the example ``simple`` model, all ones."""
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs
