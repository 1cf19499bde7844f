"""A ``TritonPythonModel`` instance: Triton's python model interface on our python backend.

``execute(requests)`` gets one ``pb_utils.InferenceRequest`` per client request (the dynamic
batcher's batch arrives as a list, each request with its own tensors) and returns one
``InferenceResponse`` per request, in order. As in Triton:

- a return that is not a list of that many responses (``None`` included) fails every request
  of the call, as does an exception raised by ``execute``: "Failed to process the request(s)
  for model '<m>', message: <why>" (an internal error, 500);
- a response made with ``error=TritonError(msg, code)`` fails its own request only, with
  ``msg`` and the HTTP status and gRPC code Triton gives ``code``.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers through each
request's ``get_response_sender()`` instead, zero or more times and then with the final flag,
from any thread and also after ``execute`` (which returns None) is over; an exception from its
``execute`` ends every request of the call not yet ended with that error. While user code runs
on the instance's thread, BLS calls know which model makes them (``server_link.caller``).

``execute``, ``is_ready``, ``initialize`` and ``finalize`` may be ``async def``; their
coroutines run on the instance's own event loop (``coroutines``). The ``pb_utils`` objects
are host (numpy) tensors: KIND_GPU instances are told their device through ``initialize``'s
args and place their own work (Triton's default of CPU-only input tensors).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from backends.base import InstanceRequest, ModelInstance, Placement, RequestResult
from backends.python.coroutines import CoroutineRunner
from backends.python.instance import checked_output
from backends.python.loading import ModelSource, forget_module
from backends.python.pb_utils.errors import TritonModelException
from backends.python.pb_utils.requests import InferenceRequest, InferenceResponse
from backends.python.pb_utils.response_sender import InferenceResponseSender
from backends.python.pb_utils.tensor import Tensor
from backends.python.server_link import LINK
from server.errors import InferenceServerError, InternalError
from server.generated import model_config_pb2 as mc
from server.protocol.datatypes import DataType
from server.protocol.proto_json import config_to_json
from server.protocol.types import ModelOutputs

log = logging.getLogger(__name__)


def initialize_args(
    model_path: Path, config: mc.ModelConfig, placement: Placement
) -> dict[str, str]:
    """What ``initialize(args)`` gets: every value a string, the config as its JSON text."""
    return {
        "model_config": json.dumps(config_to_json(config)),
        "model_instance_kind": mc.ModelInstanceGroup.Kind.Name(placement.kind).removeprefix(
            "KIND_"
        ),
        "model_instance_device_id": str(placement.device_id),
        "model_repository": str(model_path.parent.parent),
        "model_version": model_path.parent.name,
        "model_name": config.name,
    }


class TritonModelInstance(ModelInstance):
    """Calls one ``TritonPythonModel`` object with a request object per client request."""

    may_run_inline = False  # user code: always on the instance's worker thread
    takes_requests = True

    def __init__(
        self,
        source: ModelSource,
        module: ModuleType,
        model: Any,
        outputs: Mapping[str, DataType],
        coroutines: CoroutineRunner,
        decoupled: bool = False,
        instances: int = 1,
    ) -> None:
        """``model`` is initialized; ``outputs`` are the configured output datatypes;
        ``instances`` is how many the model has (for BLS's self-call check)."""
        self._decoupled = decoupled
        self._instances = instances
        self._source = source
        self._module = module
        self._model = model
        self._outputs = dict(outputs)
        self._coroutines = coroutines
        self._ready_check: Callable[[], object] | None = getattr(model, "is_ready", None)

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """One request made of ``inputs`` (schedulers use ``execute_requests``)."""
        (result,) = self.execute_requests([InstanceRequest(inputs, output_names)])
        if isinstance(result, InferenceServerError):
            raise result
        return result

    def execute_requests(self, requests: Sequence[InstanceRequest]) -> list[RequestResult]:
        objects = [InferenceRequest.from_instance_request(request) for request in requests]
        senders = self._senders(requests, objects) if self._decoupled else []
        try:
            with LINK.caller(self._source.model, self._instances):
                returned = self._call(self._model.execute, objects)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # any fault of user code
            # fails the requests of this call and nothing else
            log.error("model '%s' raised in execute", self._source.model, exc_info=exc)
            failure = self._failed(self._source.describe(exc))
            for sender in senders:
                if not sender.closed:
                    with contextlib.suppress(TritonModelException):
                        sender.send_error(failure)
            raise failure from exc
        if self._decoupled:
            if returned is not None:
                log.warning(
                    "model '%s' is decoupled: execute should return None, not %s",
                    self._source.model, type(returned).__name__,
                )
            return [{} for _ in requests]  # the responses went through the senders
        responses = self._responses(returned, len(objects))
        return [
            self._answer(request, response)
            for request, response in zip(requests, responses, strict=True)
        ]

    def _senders(
        self, requests: Sequence[InstanceRequest], objects: Sequence[InferenceRequest]
    ) -> list[InferenceResponseSender]:
        """A response sender for each request of a decoupled model."""
        senders = []
        for request, made in zip(requests, objects, strict=True):
            respond = request.respond
            if respond is None:
                raise InternalError(
                    f"model '{self._source.model}' is decoupled, but its request has no "
                    "response stream"
                )
            sender = InferenceResponseSender(
                respond, functools.partial(self._partial_answer, request), request.cancelled
            )
            made.set_response_sender(sender)
            senders.append(sender)
        return senders

    def _call(
        self, method: Callable[..., object], *args: object, setting_up: bool = False
    ) -> object:
        result = method(*args)
        if not inspect.isawaitable(result):
            return result
        if setting_up:
            return self._coroutines.run(_setting_up(result))
        return self._coroutines.run(self._as_caller(result))

    async def _as_caller(self, awaitable: Awaitable[object]) -> object:
        """``awaitable`` on the model's loop thread, marked as this model's code."""
        with LINK.caller(self._source.model, self._instances):
            return await awaitable

    def _failed(self, why: str) -> InternalError:
        return InternalError(
            f"Failed to process the request(s) for model '{self._source.model}', message: {why}"
        )

    def _responses(self, returned: object, count: int) -> list[InferenceResponse]:
        """``execute``'s return checked as Triton checks it: a list of as many responses."""
        if not isinstance(returned, list):
            raise self._failed(
                "Expected a list in the execute return, found type "
                f"'{type(returned).__name__}'."
            )
        if len(returned) != count:
            raise self._failed(
                "Number of InferenceResponse objects do not match the number of "
                f"InferenceRequest objects. InferenceRequest(s) size is:{count}, and "
                f"InferenceResponse(s) size is:{len(returned)}"
            )
        for response in returned:
            if not isinstance(response, InferenceResponse):
                raise self._failed(
                    "Expected an 'InferenceResponse' object in the execute function return "
                    f"list, found type '{type(response).__name__}'."
                )
        return returned

    def _answer(self, request: InstanceRequest, response: InferenceResponse) -> RequestResult:
        """One request's outputs from its response, or the error that fails it alone."""
        error = response.error()
        if error is not None:
            return error.to_server_error()
        tensors = {tensor.name(): tensor for tensor in response.output_tensors()}
        outputs: dict[str, np.ndarray] = {}
        try:
            for name in request.output_names:
                tensor = tensors.get(name)
                if tensor is None:
                    raise InternalError(
                        f"model '{self._source.model}' returned no output '{name}' (the "
                        f"response has {sorted(tensors)})"
                    )
                outputs[name] = checked_output(
                    self._source.model, name, self._host(tensor), self._outputs.get(name), True
                )
        except InternalError as exc:
            return exc
        return ModelOutputs(outputs, response.parameter_dict())

    def _partial_answer(
        self, request: InstanceRequest, response: InferenceResponse
    ) -> RequestResult:
        """One of a decoupled model's responses: the requested outputs it has (each response
        of a stream may carry some of them), or its error."""
        if not isinstance(response, InferenceResponse):
            raise TritonModelException(
                "Expected an 'InferenceResponse' object, found type "
                f"'{type(response).__name__}'."
            )
        error = response.error()
        if error is not None:
            return error.to_server_error()
        tensors = {tensor.name(): tensor for tensor in response.output_tensors()}
        try:
            outputs = {
                name: checked_output(
                    self._source.model, name, self._host(tensors[name]),
                    self._outputs.get(name), True,
                )
                for name in request.output_names
                if name in tensors
            }
        except InternalError as exc:
            return exc
        return ModelOutputs(outputs, response.parameter_dict())

    def _host(self, tensor: Tensor) -> object:
        """A tensor's data in host memory (a GPU tensor copied, through CuPy)."""
        if tensor.is_cpu():
            return tensor.as_numpy()
        try:
            import cupy

            return cupy.asnumpy(cupy.from_dlpack(tensor.device_data()))
        except Exception as exc:
            raise InternalError(
                f"model '{self._source.model}' output '{tensor.name()}' is in device memory "
                f"and could not be copied to the host: {type(exc).__name__}: {exc}"
            ) from exc

    def is_ready(self) -> bool:
        """The model's ``is_ready()`` (True without one); it must return a bool."""
        if self._ready_check is None:
            return True
        try:
            ready = self._call(self._ready_check)
        except (Exception, SystemExit, KeyboardInterrupt):
            log.exception("model '%s': is_ready() failed", self._source.model)
            return False
        if not isinstance(ready, bool):
            log.error("model '%s': is_ready() must return a boolean value", self._source.model)
            return False
        return ready

    def close(self) -> None:
        """``finalize`` (a failure is logged: unloading goes on), then the loop and module."""
        finalize = getattr(self._model, "finalize", None)
        try:
            if callable(finalize):
                with LINK.setting_up():
                    self._call(finalize, setting_up=True)
        except (Exception, SystemExit, KeyboardInterrupt):
            log.exception("model '%s': finalize failed", self._source.model)
        finally:
            self._coroutines.close()
            forget_module(self._module)


async def _setting_up(awaitable: Awaitable[object]) -> object:
    """An async ``initialize`` or ``finalize`` on the model's loop thread, where BLS is
    refused."""
    with LINK.setting_up():
        return await awaitable


def load(
    source: ModelSource,
    module: ModuleType,
    cls: type,
    config: mc.ModelConfig,
    placement: Placement,
    outputs: Mapping[str, DataType],
) -> TritonModelInstance:
    """Make and ``initialize`` the model object; a fault of user code fails the load."""
    coroutines = CoroutineRunner(f"{config.name}-model")
    try:
        model = cls()
        initialize = getattr(model, "initialize", None)
        if callable(initialize):
            with LINK.setting_up():
                result = initialize(initialize_args(source.path, config, placement))
            if inspect.isawaitable(result):
                coroutines.run(_setting_up(result))
    except InferenceServerError:
        coroutines.close()
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        coroutines.close()
        raise source.load_error("failed to initialize", exc) from exc
    instances = sum(group.count for group in config.instance_group) or 1
    return TritonModelInstance(
        source, module, model, outputs, coroutines,
        config.model_transaction_policy.decoupled, instances,
    )
