"""``InferenceRequest`` as ``execute`` receives it, and the ``InferenceResponse`` it returns.

One ``InferenceRequest`` stands for one client request, also when the dynamic batcher ran
several together. Its constructor takes Triton's keyword arguments for a request a model
builds itself (Business Logic Scripting), which ``exec`` runs (``bls``). A request to a
decoupled model answers through ``get_response_sender()`` (``response_sender``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from backends.base import InstanceRequest
from backends.python.pb_utils import bls
from backends.python.pb_utils.errors import TritonError, TritonModelException
from backends.python.pb_utils.tensor import Tensor

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

# Request parameters Triton turns into request properties (sequence, priority, timeout) or
# output options, which a model therefore does not see among ``parameters()``.
_NOT_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
     "binary_data_output"}
)
_RESERVED_PREFIX = "triton_"
ParameterValue = bool | int | str


def _never() -> bool:
    return False


def _text(value: str | bytes) -> str:
    """A name given as ``str`` or as UTF-8 ``bytes``, as Triton's bindings take both (a model
    often passes an element of a BYTES input, which is ``bytes``, as a model name)."""
    return value.decode() if isinstance(value, bytes) else value


class InferenceRequest:
    """A request: one client's, handed to ``execute``, or (later) one a model sends."""

    def __init__(
        self,
        *,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str | bytes] = (),
        model_name: str | bytes = "",
        model_version: int = -1,
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        parameters: Mapping[str, ParameterValue] | str | None = None,
        preferred_memory: Any = None,
        trace: Any = None,
    ) -> None:
        self._inputs = list(inputs)
        self._output_names = [_text(name) for name in requested_output_names]
        self._model_name = _text(model_name)
        self._model_version = model_version
        self._request_id = _text(request_id)
        self._correlation_id = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._parameters: dict[str, Any] = (
            json.loads(parameters) if isinstance(parameters, str) else dict(parameters or {})
        )
        self._cancelled: Callable[[], bool] = _never
        self._sender: Any = None
        self._preferred_memory = preferred_memory
        self._trace = trace

    @classmethod
    def from_instance_request(cls, request: InstanceRequest) -> InferenceRequest:
        """The object ``execute`` gets for one client request."""
        params = request.parameters
        flags = 0
        if params.get("sequence_start"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
        if params.get("sequence_end"):
            flags |= TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
        made = cls(
            inputs=[Tensor(name, array) for name, array in request.inputs.items()],
            requested_output_names=list(request.output_names),
            request_id=request.id,
            correlation_id=params.get("sequence_id", 0),
            flags=flags,
            timeout=int(params.get("timeout", 0) or 0),
            parameters={
                key: value
                for key, value in params.items()
                if key not in _NOT_PARAMETERS and not key.startswith(_RESERVED_PREFIX)
            },
        )
        made._cancelled = request.cancelled
        return made

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        """The outputs the client asked for (all of the model's when it named none)."""
        return list(self._output_names)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence id (``sequence_id`` parameter); 0 outside a sequence."""
        return self._correlation_id

    def flags(self) -> int:
        """``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` / ``_END`` bits."""
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def parameters(self) -> str:
        """The request's parameters as a JSON object string."""
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        """Whether the client has given up on the request (a model may stop early)."""
        return self._cancelled()

    def model_version(self) -> int:
        return self._model_version

    def parameter_dict(self) -> dict[str, Any]:
        """The parameters as a dict (what ``parameters()`` prints)."""
        return dict(self._parameters)

    def set_response_sender(self, sender: Any) -> None:
        """Give a decoupled model's request its sender (the python backend does)."""
        self._sender = sender

    def get_response_sender(self) -> Any:
        """The ``InferenceResponseSender`` of a request to a decoupled model."""
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is only available for requests to a decoupled model "
                "(model_transaction_policy { decoupled: true })"
            )
        return self._sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on the server (BLS) and wait: an ``InferenceResponse``, or with
        ``decoupled`` a generator of them. Refused in ``initialize`` and ``finalize``."""
        bls.check_allowed()
        return bls.stream(self) if decoupled else bls.execute(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` awaited: the model's loop serves other coroutines meanwhile."""
        bls.check_allowed()
        if decoupled:
            return await bls.stream_async(self)
        return await bls.execute_async(self)

    def __repr__(self) -> str:
        names = [tensor.name() for tensor in self._inputs]
        return f"InferenceRequest(id={self._request_id!r}, inputs={names})"


class InferenceResponse:
    """``InferenceResponse(output_tensors=[...], error=None, parameters={...})``."""

    def __init__(
        self,
        output_tensors: Iterable[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, ParameterValue] | str | None = None,
    ) -> None:
        tensors = list(output_tensors or ())
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    "InferenceResponse: output_tensors must be Tensor objects, got "
                    f"{type(tensor).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(
                f"InferenceResponse: error must be a TritonError, got {type(error).__name__}"
            )
        self._tensors = tensors
        self._error = error
        self._parameters = _response_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response parameters as a JSON object string."""
        return json.dumps(self._parameters)

    def parameter_dict(self) -> dict[str, Any]:
        """The response parameters as a dict (what ``parameters()`` prints)."""
        return dict(self._parameters)


def _response_parameters(parameters: object) -> dict[str, Any]:
    """A response's parameters checked as Triton checks them (its texts): a dict of ``str``
    keys and bool, int or str values (a JSON object string is taken too)."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    if not isinstance(parameters, Mapping):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value)}"
            )
    return dict(parameters)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input ``name``, or None."""
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(
    inference_response: InferenceResponse, name: str
) -> Tensor | None:
    """The response's output ``name``, or None."""
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)
