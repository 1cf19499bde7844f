"""What ONNX Runtime calls each tensor type, and BF16, which its numpy bridge lacks."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import onnxruntime as ort

from server.protocol import datatypes

#: ONNX Runtime type name (``NodeArg.type``, ``OrtValue.data_type()``) -> V2 datatype name
ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}
#: ONNX Runtime type name -> numpy dtype of its values (strings have none)
ORT_DTYPES = {
    name: datatypes.BY_NAME[v2].dtype for name, v2 in ORT_TYPES.items() if v2 != "BYTES"
}
BF16 = np.dtype(ml_dtypes.bfloat16)
ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16; onnx itself is not a runtime dependency


def ort_value_to_numpy(value: ort.OrtValue) -> np.ndarray:
    """A host OrtValue as numpy; BF16 through its raw bytes (the numpy bridge has none)."""
    if value.data_type() == "tensor(bfloat16)":
        raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
        return np.frombuffer(raw, dtype=BF16).reshape(value.shape())
    array: np.ndarray = value.numpy()
    return array
