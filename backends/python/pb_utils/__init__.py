"""Triton's ``triton_python_backend_utils`` for python models, written for tensorgate.

A ``model.py`` written for Triton does ``import triton_python_backend_utils as pb_utils``; the
top-level module of that name re-exports this package, and the python backend makes sure the
name resolves to it before it imports a model. What is here: tensors, requests and responses,
errors, the datatype and config helpers, ``ModelConfig`` for ``auto_complete_config``, the
logger and custom metrics, Business Logic Scripting (``InferenceRequest.exec``,
``load_model``...) and decoupled models' response senders.
"""

from backends.python.pb_utils.config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from backends.python.pb_utils.datatypes import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from backends.python.pb_utils.errors import TritonError, TritonModelException
from backends.python.pb_utils.logger import Logger
from backends.python.pb_utils.metrics import Metric, MetricFamily
from backends.python.pb_utils.model_control import is_model_ready, load_model, unload_model
from backends.python.pb_utils.requests import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    get_input_tensor_by_name,
    get_output_tensor_by_name,
)
from backends.python.pb_utils.response_sender import InferenceResponseSender
from backends.python.pb_utils.tensor import Tensor

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]
