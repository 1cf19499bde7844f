"""RequestGate: counts the requests inside, is idle only when none is, refuses once closed."""

from __future__ import annotations

import pytest

from server import event_loop
from server.errors import Unavailable
from server.request_gate import RequestGate


def test_idle_only_once_every_admitted_request_has_left_and_closed_refuses_new_ones() -> None:
    async def main() -> None:
        gate = RequestGate("closed for the test")
        assert await gate.wait_idle(1)
        with gate.admit():
            with gate.admit():
                assert gate.inside == 2
            assert gate.inside == 1
            assert not await gate.wait_idle(0.01), "one request is still inside"
        assert gate.inside == 0
        assert await gate.wait_idle(1)
        gate.close()
        with pytest.raises(Unavailable, match="closed for the test"), gate.admit():
            pass
        assert gate.inside == 0 and await gate.wait_idle(1)

    event_loop.run(main())


def test_a_request_that_fails_inside_still_leaves_the_gate() -> None:
    async def main() -> None:
        gate = RequestGate()
        with pytest.raises(ValueError), gate.admit():
            raise ValueError("the request failed")
        assert gate.inside == 0 and await gate.wait_idle(1)

    event_loop.run(main())
