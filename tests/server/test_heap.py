"""heap.settle: start-up objects frozen; the young threshold raised only when asked."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from server import heap


@pytest.fixture(autouse=True)
def restored_collector() -> Iterator[None]:
    """Whatever ``settle`` changes in this test process is put back afterwards."""
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_settle_freezes_and_keeps_the_thresholds() -> None:
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10)


def test_the_executor_raises_only_the_young_threshold() -> None:
    heap.settle(heap.EXECUTOR_YOUNG_THRESHOLD)
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (heap.EXECUTOR_YOUNG_THRESHOLD, 10, 10)
