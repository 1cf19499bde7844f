"""One python model instance: the user's object, called on whole batches.

What the user returns is checked before it reaches the response encoders: a mapping holding
every requested output, each convertible to a numpy array of the configured datatype. A wrong
dtype would otherwise be sent as the configured one and the client would read garbage bytes.
A fault in user code fails that batch with a 500; the instance keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from backends.base import PartsInstance
from backends.python.cuda import CudaPlacement
from backends.python.loading import ModelSource, forget_module
from server.cuda.copies import joined_on_host
from server.errors import InferenceServerError, InternalError
from server.memory.output_memory import OutputMemory
from server.protocol.datatypes import DataType, of_dtype

log = logging.getLogger(__name__)

UserExecute = Callable[[dict[str, Any]], object]


class PythonInstance(PartsInstance):
    """Calls ``execute`` of one ``TensorgateModel`` object, on the host or on its GPU."""

    # User code always runs on the instance's worker thread: it may block now and then, or
    # use asyncio itself, neither of which the server's event loop may do.
    may_run_inline = False

    def __init__(
        self,
        source: ModelSource,
        module: ModuleType,
        model: Any,
        outputs: Mapping[str, DataType],
        gpu: CudaPlacement | None,
    ) -> None:
        """``outputs`` are the configured output datatypes; ``gpu`` is None on KIND_CPU."""
        self._source = source
        self._module = module
        self._model = model
        self._execute: UserExecute = model.execute
        self._outputs = dict(outputs)
        self._gpu = gpu
        self.joins_on_device = gpu is not None

    def execute_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        """On KIND_GPU the batch is joined on the instance's device, run, and its device
        outputs copied back (large ones into ``memory`` where it has room); host outputs are
        taken as the model made them."""
        names = list(output_names)
        try:
            if self._gpu is None:
                inputs = {name: joined_on_host(pieces) for name, pieces in parts.items()}
                produced = self._call(inputs, names)
            else:
                with self._gpu.active():
                    produced = self._gpu.to_host(
                        self._call(self._gpu.to_device(parts), names), memory
                    )
        except InferenceServerError:
            raise
        except Exception as exc:  # CUDA copies: out of memory, a bad launch
            raise InternalError(
                f"model '{self._source.model}' failed: {self._source.describe(exc)}"
            ) from exc
        return {name: self._host_array(name, value) for name, value in produced.items()}

    def _call(self, inputs: dict[str, Any], names: list[str]) -> dict[str, object]:
        """The user's ``execute`` on ``inputs``: just the requested outputs, as returned."""
        model = self._source.model
        try:
            result = self._execute(inputs)
        except InferenceServerError:
            raise  # the model chose its own answer (a 400 for input it refuses, say)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # any fault of user code,
            # sys.exit() included, fails the batch and nothing else
            log.error("model '%s' raised in execute", model, exc_info=exc)
            raise InternalError(
                f"model '{model}' failed in execute: {self._source.describe(exc)}"
            ) from exc
        if not isinstance(result, Mapping):
            raise InternalError(
                f"model '{model}' execute returned {type(result).__name__}, expected a dict of "
                "output name to array"
            )
        missing = [name for name in names if name not in result]
        if missing:
            returned = sorted(str(key) for key in result)
            raise InternalError(
                f"model '{model}' execute did not return output(s) {missing} (it returned "
                f"{returned})"
            )
        return {name: result[name] for name in names}

    def _host_array(self, name: str, value: object) -> np.ndarray:
        return checked_output(self._source.model, name, value, self._outputs.get(name))

    def close(self) -> None:
        """Call the user's ``finalize`` (a failure is logged: unloading goes on) and forget the
        module."""
        finalize = getattr(self._model, "finalize", None)
        try:
            if callable(finalize):
                if self._gpu is None:
                    finalize()
                else:
                    with self._gpu.active():
                        finalize()
        except (Exception, SystemExit, KeyboardInterrupt):  # the instance goes regardless
            log.exception("model '%s': finalize failed", self._source.model)
        finally:
            forget_module(self._module)


def checked_output(
    model: str, name: str, value: object, declared: DataType | None, any_datatype: bool = False
) -> np.ndarray:
    """``value`` as a numpy array of output ``name``'s configured datatype, or a 500; with
    ``any_datatype`` (Triton's python models), of any datatype, as Triton sends those."""
    try:
        array = np.asarray(value)
    except Exception as exc:  # e.g. a CuPy array from a KIND_CPU instance
        raise InternalError(
            f"model '{model}' output '{name}' is not an array: {type(value).__name__} ({exc})"
        ) from exc
    if declared is None:
        return array
    if declared.is_bytes:
        if array.dtype.kind in ("S", "U"):
            return _object_bytes(array)
        if array.dtype == object:
            return array
    elif array.dtype == declared.dtype:
        return array
    if any_datatype:
        if array.dtype.kind in ("S", "U"):
            return _object_bytes(array)
        if of_dtype(array.dtype) is not None:
            return array
    raise InternalError(
        f"model '{model}' output '{name}' has dtype {array.dtype}, but the configuration "
        f"declares {declared.config_name}"
    )


def _object_bytes(array: np.ndarray) -> np.ndarray:
    """A numpy ``S``/``U`` array as BYTES travel: an object array of ``bytes`` (UTF-8 text)."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for index, item in enumerate(array.reshape(-1).tolist()):
        flat[index] = item.encode("utf-8") if isinstance(item, str) else item
    return out
