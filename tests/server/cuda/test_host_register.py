"""Pinning the shared arena, against the CuPy stand-in (gpu_tests/ pins a real one)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import ModuleType
from typing import cast

import pytest

from server.cuda import devices
from server.cuda.host_register import (
    HOST_REGISTER_PORTABLE,
    is_registered,
    register_with_cuda,
    unregister_from_cuda,
)
from server.memory.arena import Arena
from tests.fake_cupy import FakeCupy


@pytest.fixture
def arena() -> Iterator[Arena]:
    with Arena.create(1 << 20) as made:
        yield made
        unregister_from_cuda(made, cupy=cast(ModuleType, FakeCupy()))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    made = FakeCupy()
    monkeypatch.setattr(devices, "cupy_module", lambda: made)
    return made


def test_the_arena_is_registered_once_and_unregistered(
    arena: Arena, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="server.cuda.host_register")
    assert register_with_cuda(arena)
    assert fake.events == [f"hostRegister {arena.address} {arena.size} {HOST_REGISTER_PORTABLE}"]
    assert is_registered(arena)
    assert "pinned the 1048576-byte shared arena for CUDA in" in caplog.text
    assert register_with_cuda(arena), "already pinned"
    assert len(fake.events) == 1
    unregister_from_cuda(arena)
    unregister_from_cuda(arena)
    assert fake.events[1:] == [f"hostUnregister {arena.address}"]
    assert not is_registered(arena)


def test_flags_are_passed_through(arena: Arena, fake: FakeCupy) -> None:
    assert register_with_cuda(arena, flags=0)
    assert fake.events == [f"hostRegister {arena.address} {arena.size} 0"]


def test_a_refusal_is_one_warning_and_pageable_copies(
    arena: Arena, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    fake.host_register_error = RuntimeError("cudaErrorMemoryAllocation: out of memory")
    assert not register_with_cuda(arena)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "cudaErrorMemoryAllocation" in message and "RLIMIT_MEMLOCK is" in message
    assert "pageable" in message
    assert not is_registered(arena)
    unregister_from_cuda(arena)
    assert fake.events == [], "nothing to unpin"


def test_without_cuda_nothing_is_pinned(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cupy_module", lambda: None)
    assert not register_with_cuda(arena)
    assert not is_registered(arena)


def test_an_explicit_module_wins(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cupy_module", lambda: None)
    fake = FakeCupy()
    assert register_with_cuda(arena, cupy=cast(ModuleType, fake))
    unregister_from_cuda(arena, cupy=cast(ModuleType, fake))
    assert [event.split()[0] for event in fake.events] == ["hostRegister", "hostUnregister"]


def test_a_failed_unpin_is_logged_not_raised(
    arena: Arena, fake: FakeCupy, caplog: pytest.LogCaptureFixture
) -> None:
    assert register_with_cuda(arena)

    def refuse(address: int) -> None:
        raise RuntimeError("cudaErrorHostMemoryNotRegistered")

    fake.cuda.runtime.hostUnregister = refuse
    unregister_from_cuda(arena)
    assert "could not unpin the shared arena: cudaErrorHostMemoryNotRegistered" in caplog.text
    assert not is_registered(arena)
