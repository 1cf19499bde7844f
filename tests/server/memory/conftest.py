"""The shared memory object the registry tests register."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest


@pytest.fixture
def key() -> Iterator[str]:
    """A 4 KiB shared memory object holding 0..1023 as int32, removed afterwards."""
    name = f"tg_test_{uuid.uuid4().hex}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as handle:
        handle.write(np.arange(1024, dtype=np.int32).tobytes())
    yield "/" + name
    os.unlink(path)
