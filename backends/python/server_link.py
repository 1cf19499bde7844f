"""How a python model reaches the server it runs in: Business Logic Scripting and model control.

A model's ``InferenceRequest(...).exec()``, ``load_model`` and friends run on the model's own
thread, while the server's data plane lives on its event loop. The server connects this
process's one ``LINK`` to its data plane once that exists (``connect``); each call is then a
coroutine handed to the loop (``asyncio.run_coroutine_threadsafe``), and the model's thread
waits for it. So a BLS request goes through the target's scheduler, statistics and errors like
any client's, and backends never import the data plane (only the ``ServerCalls`` it offers).

A model whose only instance sends a BLS request to itself would wait for itself forever; that
call is refused at once (``caller``). Other cycles are bounded only by the request's
``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from server.errors import InferenceServerError, Unavailable
from server.protocol.model_spec import ModelSpec
from server.protocol.streaming import StreamReply
from server.protocol.types import InferRequest, InferResponse

T = TypeVar("T")


class ServerCalls(Protocol):
    """The data plane's calls a python model may make (``server.dataplane.DataPlane``)."""

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def infer_stream(self, request: InferRequest) -> AsyncIterator[StreamReply]: ...

    async def model_ready(self, name: str, version: str) -> bool: ...

    async def model_spec(self, name: str, version: str) -> ModelSpec: ...

    async def load_model(
        self, name: str, config_json: str | None, files: dict[str, bytes]
    ) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...


@dataclass(frozen=True)
class Caller:
    """The model whose code runs on this thread now, and how many instances it has."""

    model: str
    instances: int


class ServerLink:
    """The server's calls, made from a model's thread onto the server's event loop."""

    def __init__(self) -> None:
        self._calls: ServerCalls | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._local = threading.local()

    def connect(self, calls: ServerCalls, loop: asyncio.AbstractEventLoop) -> None:
        """Serve models' calls from ``calls`` on ``loop`` (the data plane's)."""
        self._calls, self._loop = calls, loop

    def disconnect(self) -> None:
        self._calls = self._loop = None

    @property
    def calls(self) -> ServerCalls:
        if self._calls is None:
            raise Unavailable(
                "the server is not serving yet: BLS requests and model control are available "
                "inside execute only"
            )
        return self._calls

    @contextlib.contextmanager
    def caller(self, model: str, instances: int) -> Iterator[None]:
        """Mark this thread as running ``model``'s code (for the self-call check)."""
        previous = getattr(self._local, "caller", None)
        self._local.caller = Caller(model, instances)
        try:
            yield
        finally:
            self._local.caller = previous

    @contextlib.contextmanager
    def setting_up(self) -> Iterator[None]:
        """Mark this thread as running a model's ``initialize`` or ``finalize``, where Triton
        refuses BLS requests (``bls_allowed``)."""
        previous = getattr(self._local, "setting_up", False)
        self._local.setting_up = True
        try:
            yield
        finally:
            self._local.setting_up = previous

    def bls_allowed(self) -> bool:
        return not getattr(self._local, "setting_up", False)

    def current_caller(self) -> Caller | None:
        caller: Caller | None = getattr(self._local, "caller", None)
        return caller

    def wait(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the server's loop and wait for it on this (a model's) thread."""
        return self.submit(coroutine).result(timeout_s)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> Future[T]:
        loop = self._loop
        if loop is None or self._calls is None:
            coroutine.close()
            raise Unavailable(
                "the server is not serving yet: BLS requests and model control are available "
                "inside execute only"
            )
        if _running_loop() is loop:
            coroutine.close()
            raise InferenceServerError("a BLS call cannot wait on the server's own event loop")
        return asyncio.run_coroutine_threadsafe(coroutine, loop)

    async def awaiting(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """``coroutine`` run on the server's loop, awaited from another loop (``async_exec``)."""
        return await asyncio.wrap_future(self.submit(coroutine))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


#: This process's link; the server connects it when its data plane is up.
LINK = ServerLink()
