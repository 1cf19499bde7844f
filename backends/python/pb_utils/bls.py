"""Business Logic Scripting: a model's own ``InferenceRequest`` run by the server it is in.

``exec`` converts the request to the data plane's record, runs it through ``server_link``
(the target's scheduler, statistics and errors, as for a client) and converts the answer back.
Failures come back as a response whose ``error()`` says why, with Triton's texts: an unknown or
unready target is "Failed for execute the inference request. Model '<m>' is not ready.", a
decoupled target asked without ``decoupled=True`` gets python_backend's refusal. With
``decoupled=True`` the responses come one by one from a generator, ending at the final flag.
"""

from __future__ import annotations

import asyncio
import queue
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.python.pb_utils.errors import TritonError, TritonModelException
from backends.python.pb_utils.tensor import Tensor
from backends.python.server_link import LINK
from server import errors
from server.protocol import datatypes
from server.protocol.streaming import StreamReply
from server.protocol.types import InferRequest, InferResponse, InputTensor, RequestedOutput

if TYPE_CHECKING:
    from backends.python.pb_utils.requests import InferenceRequest, InferenceResponse

_CODES: tuple[tuple[type[errors.InferenceServerError], int], ...] = (
    (errors.InvalidArgument, TritonError.INVALID_ARG),
    (errors.NotFound, TritonError.NOT_FOUND),
    (errors.Unavailable, TritonError.UNAVAILABLE),
    (errors.Unsupported, TritonError.UNSUPPORTED),
    (errors.AlreadyExists, TritonError.ALREADY_EXISTS),
    (errors.Cancelled, TritonError.CANCELLED),
    (errors.UnknownError, TritonError.UNKNOWN),
)


def triton_error(error: BaseException) -> TritonError:
    """``error`` as the ``TritonError`` a BLS response carries (its text unchanged)."""
    if isinstance(error, errors.InferenceServerError):
        code = next((c for kind, c in _CODES if isinstance(error, kind)), TritonError.INTERNAL)
        return TritonError(error.message, code)
    return TritonError(f"{type(error).__name__}: {error}", TritonError.INTERNAL)


def not_ready(model: str) -> errors.InternalError:
    return errors.InternalError(
        f"Failed for execute the inference request. Model '{model}' is not ready."
    )


def decoupled_refused(model: str) -> errors.Unsupported:
    return errors.Unsupported(
        f"Model {model} is using the decoupled. The current BLS request call doesn't support "
        "models using the decoupled transaction policy. Please use 'decoupled=True' argument "
        "to the 'exec' or 'async_exec' calls for decoupled models.'"
    )


def self_call_refused(model: str) -> errors.Unavailable:
    return errors.Unavailable(
        f"BLS request to model '{model}' refused: it comes from that model's only instance, "
        "which would wait for itself forever (give the model more instances)"
    )


def check_allowed() -> None:
    """Triton refuses BLS requests made from ``initialize`` or ``finalize`` (it raises)."""
    if not LINK.bls_allowed():
        raise TritonModelException("BLS is only supported during the 'execute' function.")


def server_request(request: InferenceRequest) -> InferRequest:
    """The data plane's record of a model's request."""
    params: dict[str, Any] = dict(request.parameter_dict())
    if request.timeout():
        params["timeout"] = request.timeout()
    if request.correlation_id():
        params["sequence_id"] = request.correlation_id()
    if request.flags() & 1:
        params["sequence_start"] = True
    if request.flags() & 2:
        params["sequence_end"] = True
    inputs = []
    for tensor in request.inputs():
        array = tensor.as_numpy()
        if array.dtype.kind in ("S", "U"):  # BYTES travel as object arrays of bytes
            array = np.array(
                [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()],
                dtype=object,
            ).reshape(array.shape)
        inputs.append(InputTensor(tensor.name(), _datatype(array), tuple(array.shape), array))
    names = request.requested_output_names()
    return InferRequest(
        request.model_name(), _version(request.model_version()), inputs,
        [RequestedOutput(name) for name in names] if names else None,
        request.request_id() or None, params,
    )


def _version(version: int) -> str:
    return "" if version < 0 else str(version)


def _datatype(array: np.ndarray) -> datatypes.DataType:
    if array.dtype.kind in ("O", "S", "U"):
        return datatypes.BY_NAME["BYTES"]
    for datatype in datatypes.BY_NAME.values():
        if datatype.dtype == array.dtype:
            return datatype
    raise errors.InvalidArgument(f"BLS input has an unsupported dtype {array.dtype}")


def model_response(response: InferResponse) -> InferenceResponse:
    """The ``InferenceResponse`` a model gets for a server's response (outputs copied)."""
    from backends.python.pb_utils.requests import InferenceResponse

    try:
        tensors = [Tensor(o.name, np.array(o.data, copy=True)) for o in response.outputs]
    finally:
        response.release()
    return InferenceResponse(output_tensors=tensors, parameters=_plain(response.parameters))


def _plain(parameters: dict[str, Any]) -> dict[str, bool | int | str]:
    return {k: v for k, v in parameters.items() if isinstance(v, bool | int | str)}


def error_response(error: BaseException) -> InferenceResponse:
    from backends.python.pb_utils.requests import InferenceResponse

    return InferenceResponse(error=triton_error(error))


def _refusal(request: InferenceRequest) -> errors.InferenceServerError | None:
    caller = LINK.current_caller()
    if caller is not None and caller.model == request.model_name() and caller.instances <= 1:
        return self_call_refused(request.model_name())
    return None


async def _checked(request: InferRequest, decoupled_ok: bool) -> None:
    calls = LINK.calls
    if not await calls.model_ready(request.model_name, request.model_version):
        raise not_ready(request.model_name)
    spec = await calls.model_spec(request.model_name, request.model_version)
    if spec.decoupled and not decoupled_ok:
        raise decoupled_refused(request.model_name)


async def _infer(request: InferRequest) -> InferResponse:
    await _checked(request, decoupled_ok=False)
    return await LINK.calls.infer(request)


def _wait_s(request: InferenceRequest) -> float | None:
    """How long a model's thread waits for its request: its ``timeout`` (µs), plus a second
    for the server to answer that timeout itself; no bound without one."""
    return request.timeout() / 1e6 + 1.0 if request.timeout() else None


def execute(request: InferenceRequest) -> InferenceResponse:
    """``request.exec()``: run it and wait, on the model's thread."""
    refused = _refusal(request)
    if refused is not None:
        return error_response(refused)
    try:
        future = LINK.submit(_infer(server_request(request)))
    except errors.InferenceServerError as exc:
        return error_response(exc)
    try:
        return model_response(future.result(_wait_s(request)))
    except TimeoutError:
        future.cancel()
        return error_response(errors.Unavailable(
            f"BLS request to model '{request.model_name()}' timed out after "
            f"{request.timeout()} us"
        ))
    except Exception as exc:  # noqa: BLE001 - the target's error, as the response's
        return error_response(exc)


async def execute_async(request: InferenceRequest) -> InferenceResponse:
    """``await request.async_exec()``: the same, awaited on the model's own loop."""
    refused = _refusal(request)
    if refused is not None:
        return error_response(refused)
    try:
        coroutine = LINK.awaiting(_infer(server_request(request)))
        return model_response(await asyncio.wait_for(coroutine, _wait_s(request)))
    except Exception as exc:  # noqa: BLE001 - any failure is the response's error
        return error_response(exc)


class ResponseIterator:
    """``exec(decoupled=True)``'s answer, as Triton's: the target's responses in order, each
    ``next`` waiting for the next one; the last is the one with the final flag (a flags-only
    final is an empty response), an error is a response with the error. Iterating again once
    all have come starts from the first. ``cancel()`` asks the target to stop."""

    def __init__(self, request: InferenceRequest) -> None:
        self._replies: queue.Queue[StreamReply | BaseException] = queue.Queue()
        self._responses: list[InferenceResponse] = []
        self._index = 0
        self._finished = False
        self._future: Future[None] | None = None
        refused = _refusal(request)
        if refused is not None:
            self._replies.put(refused)
            return
        try:
            self._future = LINK.submit(self._pump(request))
        except errors.InferenceServerError as exc:
            self._replies.put(exc)

    async def _pump(self, request: InferenceRequest) -> None:
        try:
            record = server_request(request)
            await _checked(record, decoupled_ok=True)
            async for reply in LINK.calls.infer_stream(record):
                self._replies.put(reply)
                if reply.final:
                    return
            self._replies.put(StreamReply(final=True))  # the stream ended without its flag
        except BaseException as exc:
            self._replies.put(exc)
            raise

    def wait_first(self) -> ResponseIterator:
        """Wait until the first response has come (Triton's ``exec`` returns then)."""
        if not self._responses and not self._finished:
            self._take()
            self._index = 0
        return self

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._index < len(self._responses):
            self._index += 1
            return self._responses[self._index - 1]
        if self._finished:
            raise StopIteration
        self._index += 1
        return self._take()

    def _take(self) -> InferenceResponse:
        item = self._replies.get()
        if isinstance(item, BaseException):
            self._finished = True
            if isinstance(item, asyncio.CancelledError):
                item = errors.Cancelled("the BLS request was cancelled")
            response = error_response(item)
        else:
            self._finished = item.final
            if item.error is not None:
                response = error_response(item.error)
            elif item.response is not None:
                response = model_response(item.response)
            else:
                response = _empty_response()
        self._responses.append(response)
        return response

    def cancel(self) -> None:
        """Stop the target's stream (no more responses come)."""
        if self._future is not None and not self._finished:
            self._future.cancel()


def _empty_response() -> InferenceResponse:
    from backends.python.pb_utils.requests import InferenceResponse

    return InferenceResponse()


def stream(request: InferenceRequest) -> ResponseIterator:
    """``request.exec(decoupled=True)``: sent at once; returns when the first response has
    come."""
    return ResponseIterator(request).wait_first()


async def stream_async(request: InferenceRequest) -> ResponseIterator:
    """``await async_exec(decoupled=True)``: the same, the wait for the first response off the
    model's loop (the iterator's later ``next`` calls wait as Triton's do)."""
    iterator = ResponseIterator(request)  # on this thread: the self-call check needs it
    return await asyncio.to_thread(iterator.wait_first)
