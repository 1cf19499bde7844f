"""The helpers Triton's python models import: datatypes, tensors, requests, responses, errors,
config dicts and ``ModelConfig`` for auto-complete, and the module's public names."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from backends.base import InstanceRequest
from backends.python import pb_utils as package
from server import errors


def test_the_top_level_module_is_the_package() -> None:
    assert pb_utils.__all__ == package.__all__
    for name in package.__all__:
        assert getattr(pb_utils, name) is getattr(package, name)


def test_datatype_helpers() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_STRING"] is np.object_
    assert pb_utils.TRITON_STRING_TO_NUMPY["TYPE_BOOL"] is bool
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(99) is None
    assert pb_utils.numpy_to_triton_type(np.float16) == 10
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.bool_) == 1


def test_bytes_serialization_round_trips_every_byte() -> None:
    values = np.array([[b"", b"a\x00b"], [b"\xff", "text"]], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded == b"\0\0\0\0" + b"\3\0\0\0a\0b" + b"\1\0\0\0\xff" + b"\4\0\0\0text"
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == object
    assert decoded.tolist() == [b"", b"a\x00b", b"\xff", b"text"]
    assert pb_utils.serialize_byte_tensor(np.zeros(2, np.float32)) is None
    with pytest.raises(ValueError):
        pb_utils.deserialize_bytes_tensor(b"\5\0\0\0ab")


def test_tensor_numpy_and_dlpack() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("X", data)
    assert tensor.name() == "X" and tensor.is_cpu()
    assert tensor.as_numpy() is data
    back = pb_utils.Tensor.from_dlpack("Y", tensor.to_dlpack())
    assert back.is_cpu() and back.name() == "Y"
    np.testing.assert_array_equal(back.as_numpy(), data)
    from_array = pb_utils.Tensor.from_dlpack("Z", data)  # any object with __dlpack__
    assert np.shares_memory(from_array.as_numpy(), data)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("X", [1, 2])
    text = pb_utils.Tensor("S", np.array([b"a"], dtype=object))
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        text.to_dlpack()


def test_request_as_execute_sees_it() -> None:
    cancelled = [False]
    served = InstanceRequest(
        {"A": np.ones(2, np.int32)},
        ["OUT"],
        "req-7",
        {"sequence_id": 42, "sequence_start": True, "priority": 1, "timeout": 5, "custom": "x",
         "n": 3, "triton_enable_empty_final_response": True},
        lambda: cancelled[0],
    )
    request = pb_utils.InferenceRequest.from_instance_request(served)
    assert [t.name() for t in request.inputs()] == ["A"]
    assert pb_utils.get_input_tensor_by_name(request, "A") is not None
    assert pb_utils.get_input_tensor_by_name(request, "B") is None
    assert request.requested_output_names() == ["OUT"]
    assert request.request_id() == "req-7"
    assert request.correlation_id() == 42
    assert request.flags() == pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    assert json.loads(request.parameters()) == {"custom": "x", "n": 3}
    assert not request.is_cancelled()
    cancelled[0] = True
    assert request.is_cancelled()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled model"):
        request.get_response_sender()
    answer = request.exec()  # no server to run it: an error response, as BLS errors are
    assert answer.has_error()
    assert "not serving yet" in answer.error().message()


def test_a_request_can_be_built_as_for_bls() -> None:
    request = pb_utils.InferenceRequest(
        model_name="other",
        requested_output_names=["OUT"],
        inputs=[pb_utils.Tensor("IN", np.zeros(1, np.float32))],
        parameters={"k": 1},
    )
    assert request.model_name() == "other"
    assert json.loads(request.parameters()) == {"k": 1}


def test_response_and_errors() -> None:
    out = pb_utils.Tensor("OUT", np.zeros(1, np.float32))
    response = pb_utils.InferenceResponse(output_tensors=[out], parameters={"a": True, "b": 2})
    assert not response.has_error() and response.error() is None
    assert pb_utils.get_output_tensor_by_name(response, "OUT") is out
    assert pb_utils.get_output_tensor_by_name(response, "NO") is None
    assert json.loads(response.parameters()) == {"a": True, "b": 2}
    failed = pb_utils.InferenceResponse(
        error=pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND)
    )
    assert failed.has_error()
    error = failed.error()
    assert error is not None and error.message() == "bad"
    assert error.code() == pb_utils.TritonError.NOT_FOUND == 2
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    # Triton's texts for parameters it cannot send
    bad: list[tuple[Any, str]] = [
        ({"a": 1.5}, "values to have type bool/int/str, found type <class 'float'>"),
        ({"a": None}, "values to have type bool/int/str, found type <class 'NoneType'>"),
        ({1: "x"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ([], "Expect dict, got <class 'list'>"),
    ]
    for parameters, text in bad:
        with pytest.raises(pb_utils.TritonModelException, match=re.escape(text)):
            pb_utils.InferenceResponse(parameters=parameters)
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors=[np.zeros(1)])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("code", "cls", "http", "grpc"),
    [
        (pb_utils.TritonError.UNKNOWN, errors.UnknownError, 400, "UNKNOWN"),
        (pb_utils.TritonError.INTERNAL, errors.InternalError, 500, "INTERNAL"),
        (pb_utils.TritonError.NOT_FOUND, errors.NotFound, 404, "NOT_FOUND"),
        (pb_utils.TritonError.INVALID_ARG, errors.InvalidArgument, 400, "INVALID_ARGUMENT"),
        (pb_utils.TritonError.UNAVAILABLE, errors.Unavailable, 503, "UNAVAILABLE"),
        (pb_utils.TritonError.UNSUPPORTED, errors.Unsupported, 501, "UNIMPLEMENTED"),
        (pb_utils.TritonError.ALREADY_EXISTS, errors.AlreadyExists, 400, "ALREADY_EXISTS"),
        (pb_utils.TritonError.CANCELLED, errors.Cancelled, 400, "CANCELLED"),
    ],
)
def test_error_codes_map_as_triton_maps_them(
    code: int, cls: type[errors.InferenceServerError], http: int, grpc: str
) -> None:
    error = pb_utils.TritonError("why", code).to_server_error()
    assert type(error) is cls
    assert (error.message, error.http_status, error.grpc_status_name) == ("why", http, grpc)


def test_config_helpers() -> None:
    config = {
        "input": [{"name": "A", "data_type": "TYPE_FP32"}],
        "output": [{"name": "B", "data_type": "TYPE_INT32"}],
        "model_transaction_policy": {"decoupled": False},
    }
    assert pb_utils.get_input_config_by_name(config, "A") == config["input"][0]  # type: ignore[index]
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "B")["data_type"] == "TYPE_INT32"
    assert not pb_utils.using_decoupled_model_transaction_policy(config)
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}}
    )
    assert not pb_utils.using_decoupled_model_transaction_policy({})


def _model_config(**extra: object) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(
        json.dumps({"name": "m", "max_batch_size": 0, "input": [], "output": [], **extra})
    )


def test_model_config_adds_and_completes_tensors() -> None:
    config = _model_config(input=[{"name": "A", "data_type": "TYPE_INVALID", "dims": []}])
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_input({"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    data = config.as_dict()
    assert data["input"] == [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
    ]
    assert data["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]
    assert data["max_batch_size"] == 8 and data["dynamic_batching"] == {}
    assert data["model_transaction_policy"] == {"decoupled": False}


def test_model_config_refuses_what_contradicts_the_file() -> None:
    config = _model_config(
        max_batch_size=8,
        input=[{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
        sequence_batching={},
        model_transaction_policy={"decoupled": True},
    )
    with pytest.raises(ValueError, match="configuration expects datatype TYPE_FP32 for input 'A'"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match=r"the model expects dims \[3\] but the model "):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [3]})
    with pytest.raises(ValueError, match="missing 'dims' property"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="contains property other than"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "x": 1})
    with pytest.raises(ValueError, match="specified max_batch_size 8"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="scheduling_choice as 'sequence_batching'"):
        config.set_dynamic_batching()
    with pytest.raises(ValueError, match="already set to 'True'"):
        config.set_model_transaction_policy({"decoupled": False})


def test_logger_writes_into_the_server_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="triton_python_backend_utils"):
        pb_utils.Logger.log_info("an info line")
        pb_utils.Logger.log_warn("a warning line")
        pb_utils.Logger.log_error("an error line")
        pb_utils.Logger.log_verbose("a verbose line")
        pb_utils.Logger.log("explicit", pb_utils.Logger.ERROR)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "an info line"),
        ("WARNING", "a warning line"),
        ("ERROR", "an error line"),
        ("DEBUG", "a verbose line"),
        ("ERROR", "explicit"),
    ]
    assert all(r.filename == "test_surface.py" for r in caplog.records)  # the caller's line
