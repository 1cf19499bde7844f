"""``Tensor``: a named array as Triton's python models take and make them.

Host tensors are numpy arrays (BYTES: object arrays of ``bytes``). A tensor made with
``from_dlpack`` from a device array (a CuPy or torch CUDA tensor) stays that object, with
``is_cpu()`` false; the backend copies it to the host when it is an output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backends.python.pb_utils.errors import TritonModelException

_DLPACK_CPU = 1  # DLDeviceType kDLCPU


class Tensor:
    """``Tensor(name, numpy_array)``."""

    def __init__(self, name: str, data: Any) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}': expected a numpy array, got {type(data).__name__} (use "
                "Tensor.from_dlpack for other arrays)"
            )
        self._name = name
        self._data: Any = data
        self._cpu = True

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return self._cpu

    def as_numpy(self) -> np.ndarray:
        """The numpy array (a view, not a copy); raises for a tensor on a GPU."""
        if not self._cpu:
            raise TritonModelException(
                f"Tensor '{self._name}' is stored in GPU memory and cannot be converted to NumPy"
            )
        array: np.ndarray = self._data
        return array

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (numeric tensors only), for torch/CuPy ``from_dlpack``."""
        if self._cpu and self._data.dtype == object:
            raise TritonModelException(
                f"Tensor '{self._name}': a BYTES tensor cannot be exported through DLPack"
            )
        return self._data.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor of an object with ``__dlpack__`` (torch, CuPy, numpy) or of a DLPack
        capsule of host memory, sharing its memory."""
        if not hasattr(dlpack, "__dlpack__"):
            dlpack = _HostCapsule(dlpack)
        device = dlpack.__dlpack_device__()[0] if hasattr(dlpack, "__dlpack_device__") else 1
        tensor = Tensor.__new__(Tensor)
        tensor._name = name
        if device == _DLPACK_CPU:
            try:
                tensor._data = np.from_dlpack(dlpack)
            except (BufferError, TypeError, RuntimeError) as exc:
                raise TritonModelException(
                    f"Tensor '{name}': cannot read the DLPack tensor: {exc}"
                ) from exc
            tensor._cpu = True
        else:
            tensor._data = dlpack
            tensor._cpu = False
        return tensor

    def device_data(self) -> Any:
        """The object a GPU tensor was made from (the backend copies it to the host)."""
        return self._data

    def __repr__(self) -> str:
        where = "CPU" if self._cpu else "GPU"
        return f"Tensor({self._name!r}, {where}, shape={tuple(self._data.shape)})"


class _HostCapsule:
    """A bare DLPack capsule as numpy's ``from_dlpack`` takes it (it wants ``__dlpack__``);
    a capsule of device memory is refused by numpy with a clear error."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)
