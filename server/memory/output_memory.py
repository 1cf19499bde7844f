"""Memory a caller offers a model run for its outputs, so that they need not be copied there
afterwards: the executor process offers blocks of the arena its front ends read
(``server.ipc.tensors.LentBlocks``), and ``ModelInstance.execute_into`` may take them."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class OutputMemory(Protocol):
    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        """A writable C-contiguous array of ``dtype`` and ``shape`` (None: no room). What is
        allocated and not returned as an output is the caller's to reclaim."""
