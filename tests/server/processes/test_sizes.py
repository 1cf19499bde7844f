"""Arena sizes of the split layout: the pinned budget shared out, never below one body."""

from __future__ import annotations

from server.processes.sizes import output_arena_bytes, request_arena_bytes
from server.settings import Settings

MIB = 1 << 20


def test_the_pinned_budget_is_shared_out_among_the_front_ends() -> None:
    settings = Settings(pinned_memory_pool_byte_size=1024 * MIB, http_max_input_size=MIB)
    assert request_arena_bytes(settings, 4) == 256 * MIB
    assert output_arena_bytes(settings, 4) == 128 * MIB


def test_a_request_arena_always_holds_the_largest_body() -> None:
    settings = Settings()  # 256 MiB budget, 64 MiB bodies
    assert request_arena_bytes(settings, 16) == 128 * MIB  # 64 MiB + slack: a 128 MiB block
    assert request_arena_bytes(settings, 1) == 256 * MIB
    assert output_arena_bytes(settings, 16) == 16 * MIB  # the floor
