"""heap.settle: start-up objects frozen, young collections made rarer, the older ones kept."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from server import heap


@pytest.fixture
def restored_collector() -> Iterator[None]:
    """Whatever ``settle`` changes in this test process is put back afterwards."""
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_settle_freezes_and_raises_only_the_young_threshold() -> None:
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)
    assert heap.YOUNG_THRESHOLD > 700
