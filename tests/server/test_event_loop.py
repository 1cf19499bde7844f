"""The server's event loop: uvloop when it is installed, asyncio's own otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from server import event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_runs_on_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    assert event_loop.run(_loop_module()).startswith("uvloop")


def test_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails as if not installed
    assert event_loop.loop_factory() is None
    assert event_loop.run(_loop_module()).startswith("asyncio")
