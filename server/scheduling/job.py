"""What a scheduler is asked to run: one validated request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from backends.base import InstanceRequest, ResponseSink
from server.memory.output_memory import OutputMemory
from server.scheduling.times import ExecutionTimes


@dataclass
class Job:
    """One request's backend-shaped inputs, the outputs it wants, its row count (the leading
    dimension; 1 for models without batching), its scheduling parameters, and what an
    instance that takes requests one by one is shown of it (id, parameters, cancellation)."""

    inputs: Mapping[str, np.ndarray]
    output_names: Sequence[str]
    rows: int = 1
    priority: int = 0  # 0 = the model's default level
    timeout_us: int | None = None  # the request's own queue timeout, if any
    times: ExecutionTimes = field(default_factory=ExecutionTimes)
    request_id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    #: set once its client has given up while it executes (read by the instance's thread)
    cancelled: bool = False
    #: a decoupled model's responses go here (``ResponseSink``), not into the job's result
    respond: ResponseSink | None = None
    #: where a run of this job alone may write its outputs (``ModelInstance.execute_into``)
    memory: OutputMemory | None = None

    def instance_request(self) -> InstanceRequest:
        """The request as ``ModelInstance.execute_requests`` takes it."""
        return InstanceRequest(
            self.inputs, self.output_names, self.request_id, self.parameters,
            lambda: self.cancelled, self.respond,
        )


class Scheduler(Protocol):
    """What the data plane runs jobs through: the direct scheduler or the dynamic batcher."""

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Run the job (maybe batched with others) and return its outputs."""

    #: Whether every instance joins batches on its GPU, so inputs may be CuPy arrays (those
    #: read from CUDA shared memory stay on the device); otherwise inputs are numpy.
    takes_device_arrays: bool

    async def ready(self) -> bool:
        """Whether every instance says it can serve (``ModelInstance.is_ready``)."""

    @property
    def pending(self) -> int:
        """Requests waiting to start executing (Triton's pending request count)."""

    def close(self, wait: bool = True) -> None:
        """Stop the instances' worker threads and release the instances (called on the
        event loop, once no request is running; ``wait=False`` when stopping by force)."""

    async def aclose(self) -> None:
        """``close()`` for an idle scheduler, releasing each instance on its own worker
        thread so that the event loop keeps serving meanwhile."""
