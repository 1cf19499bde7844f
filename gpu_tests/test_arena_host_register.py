"""The shared arena on a real GPU: cudaHostRegister accepts a MAP_SHARED memfd mapping (here a
second mapping of the fd, as the executor attaches the arena), the pages read as pinned host
memory, and a host-to-device copy from them is intact. Prints the figures the scale-out facts
leave open: the cost of pinning 256 MiB, and what RLIMIT_MEMLOCK does to it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from server.cuda.host_register import is_registered, register_with_cuda, unregister_from_cuda
from server.memory.arena import Arena

ROOT = Path(__file__).resolve().parents[1]
SIZE = 256 << 20


def _memory_type(runtime: object, address: int) -> int:
    """cudaPointerGetAttributes' memory type (``type``; ``memoryType`` in older CuPy)."""
    attributes = runtime.pointerGetAttributes(address)  # type: ignore[attr-defined]
    return int(getattr(attributes, "type", getattr(attributes, "memoryType", -1)))


def test_a_256_mib_arena_is_pinned_and_copies_to_the_device() -> None:
    import cupy

    runtime = cupy.cuda.runtime
    cupy.cuda.Device(0).use()  # the context exists before pinning, as in the executor
    with Arena.create(SIZE) as owner, Arena.attach(os.dup(owner.fd), SIZE, writable=True) as peer:
        started = time.perf_counter()
        assert register_with_cuda(peer), "cudaHostRegister refused the arena (see the warning)"
        pinning = time.perf_counter() - started
        try:
            assert is_registered(peer)
            host_type = getattr(runtime, "memoryTypeHost", 1)
            assert _memory_type(runtime, peer.address + SIZE // 2) == host_type
            plain = np.ones(1 << 20, dtype=np.uint8)  # control: pageable memory is not
            assert _memory_type(runtime, plain.ctypes.data) != host_type

            # The front end writes through its mapping; the executor copies from its own.
            count = 16 << 20  # 64 MiB of float32
            offset = 64 << 20
            values = np.arange(count, dtype=np.float32)
            owner.array[offset : offset + values.nbytes] = values.view(np.uint8)
            source = peer.array[offset : offset + values.nbytes].view(np.float32)
            device = cupy.empty(count, dtype=np.float32)
            stream = cupy.cuda.Stream(non_blocking=True)
            device.set(source, stream=stream)  # pinned: an asynchronous DMA
            stream.synchronize()
            np.testing.assert_array_equal(cupy.asnumpy(device), values)

            started = time.perf_counter()
            for _ in range(5):
                device.set(source, stream=stream)
            stream.synchronize()
            pinned_rate = 5 * values.nbytes / (time.perf_counter() - started) / 1e9
            pageable = np.array(values)
            device.set(pageable, stream=stream)
            stream.synchronize()
            started = time.perf_counter()
            for _ in range(5):
                device.set(pageable, stream=stream)
            stream.synchronize()
            pageable_rate = 5 * values.nbytes / (time.perf_counter() - started) / 1e9
            print(
                f"\nhostRegister of {SIZE >> 20} MiB: {pinning * 1e3:.1f} ms; H2D from the arena "
                f"{pinned_rate:.1f} GB/s, from pageable numpy {pageable_rate:.1f} GB/s; "
                f"RLIMIT_MEMLOCK {resource.getrlimit(resource.RLIMIT_MEMLOCK)}"
            )
            del source
        finally:
            unregister_from_cuda(peer)
        assert not is_registered(peer)


def test_a_low_memlock_limit_never_breaks_the_arena() -> None:
    """Under an 8 MiB RLIMIT_MEMLOCK (a container's default) pinning either works (the driver
    does not charge it) or is refused with one warning: never an exception or a crash."""
    child = textwrap.dedent(
        """
        import resource
        from server.cuda.host_register import register_with_cuda, unregister_from_cuda
        from server.memory.arena import Arena

        _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (8 << 20, hard))
        with Arena.create(256 << 20) as arena:
            pinned = register_with_cuda(arena)
            unregister_from_cuda(arena)
        print("pinned" if pinned else "pageable")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcome = done.stdout.strip().splitlines()[-1]
    assert outcome in ("pinned", "pageable")
    print(f"\nwith RLIMIT_MEMLOCK 8 MiB, a 256 MiB arena is {outcome}: {done.stderr.strip()}")
