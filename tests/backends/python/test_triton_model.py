"""TritonPythonModel on the python backend, without a server: initialize's args, execute per
request (sync and async), the checks of what it returns, per-request errors, is_ready,
finalize and auto_complete_config."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import InstanceRequest, ModelInstance, Placement
from backends.python.backend import PythonBackend
from scripts import make_models
from server.errors import InternalError, InvalidArgument, ModelLoadError, NotFound
from server.generated import model_config_pb2 as mc

CPU = Placement(mc.ModelInstanceGroup.KIND_CPU)

# OUT = IN + 1 for each request; the request's id, correlation id and parameters are echoed
# in response parameters; the args initialize got are kept on the instance's module.
ADD_ONE = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

SEEN = {}

class TritonPythonModel:
    def initialize(self, args):
        SEEN["args"] = args
        config = json.loads(args["model_config"])
        out = pb_utils.get_output_config_by_name(config, "OUT")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])

    def execute(self, requests):
        SEEN["count"] = len(requests)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.Tensor("OUT", (x + 1).astype(self.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses

    def finalize(self):
        SEEN["finalized"] = True
"""


def _write(root: Path, code: str) -> Path:
    path = root / "m" / "1" / "model.py"
    make_models.write_text(textwrap.dedent(code), path)
    return path


def _config(extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        'name: "m" backend: "python" max_batch_size: 4 '
        'input { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } '
        'output { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ' + extra,
        mc.ModelConfig(),
    )


def _load(tmp_path: Path, code: str, placement: Placement = CPU) -> ModelInstance:
    return PythonBackend().load_instance(_write(tmp_path, code), _config(), placement)


def _request(values: list[int], request_id: str = "") -> InstanceRequest:
    return InstanceRequest({"IN": np.array([values], np.int32)}, ["OUT"], request_id)


def _seen(instance: ModelInstance) -> dict[str, object]:
    return instance._module.SEEN  # type: ignore[attr-defined, no-any-return]


def test_initialize_gets_triton_args(tmp_path: Path) -> None:
    gpu = Placement(mc.ModelInstanceGroup.KIND_GPU, 1)
    instance = _load(tmp_path, ADD_ONE, gpu)  # needs no CUDA: the model places its own work
    try:
        args = _seen(instance)["args"]
    finally:
        instance.close()
    assert isinstance(args, dict)
    assert all(isinstance(v, str) for v in args.values())
    assert args["model_instance_kind"] == "GPU"
    assert args["model_instance_device_id"] == "1"
    assert args["model_repository"] == str(tmp_path / "m")
    assert (args["model_version"], args["model_name"]) == ("1", "m")
    config = json.loads(args["model_config"])
    assert config["name"] == "m" and config["max_batch_size"] == 4
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    assert config["output"][0]["dims"] == [-1]  # int64 as numbers, as the endpoint prints


def test_each_request_is_answered_on_its_own(tmp_path: Path) -> None:
    instance = _load(tmp_path, ADD_ONE)
    assert instance.takes_requests and not instance.may_run_inline
    try:
        results = instance.execute_requests([_request([1, 2]), _request([-1]), _request([5])])
        count = _seen(instance)["count"]
    finally:
        instance.close()
    assert count == 3
    first, second, third = results
    assert isinstance(first, dict) and isinstance(third, dict)
    np.testing.assert_array_equal(first["OUT"], [[2, 3]])
    np.testing.assert_array_equal(third["OUT"], [[6]])
    assert isinstance(second, InvalidArgument) and second.message == "negative input"


def test_finalize_is_called_on_close(tmp_path: Path) -> None:
    instance = _load(tmp_path, ADD_ONE)
    seen = _seen(instance)
    instance.close()
    assert seen["finalized"] is True


ASYNC = """
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.ready = True

    async def execute(self, requests):
        await asyncio.sleep(0)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]
            )
            for r in requests
        ]

    async def is_ready(self):
        await asyncio.sleep(0)
        return self.ready

    async def finalize(self):
        await asyncio.sleep(0)
"""


def test_async_execute_and_is_ready(tmp_path: Path) -> None:
    instance = _load(tmp_path, ASYNC)
    try:
        (result,) = instance.execute_requests([_request([3])])
        assert instance.is_ready() is True
        instance._model.ready = False  # type: ignore[attr-defined]
        assert instance.is_ready() is False
    finally:
        instance.close()
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["OUT"], [[6]])


@pytest.mark.parametrize(
    ("returned", "why"),
    [
        ("None", "Expected a list in the execute return, found type 'NoneType'."),
        ("[]", ("Number of InferenceResponse objects do not match the number of "
               "InferenceRequest objects. InferenceRequest(s) size is:2, and "
               "InferenceResponse(s) size is:0")),
        ("[None, None]", ("Expected an 'InferenceResponse' object in the execute function "
                         "return list, found type 'NoneType'.")),
    ],
)
def test_a_wrong_return_fails_every_request(tmp_path: Path, returned: str, why: str) -> None:
    code = f"""
    class TritonPythonModel:
        def execute(self, requests):
            return {returned}
    """
    instance = _load(tmp_path, code)
    try:
        with pytest.raises(InternalError) as caught:
            instance.execute_requests([_request([1]), _request([2])])
    finally:
        instance.close()
    assert caught.value.message == (
        f"Failed to process the request(s) for model 'm', message: {why}"
    )


def test_an_exception_in_execute_fails_that_call_only(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
            if x[0, 0] == 0:
                raise ValueError(f"cannot take zero, see {__file__}")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]) for _ in requests]
    """
    instance = _load(tmp_path, code)
    try:
        with pytest.raises(InternalError) as caught:
            instance.execute_requests([_request([0])])
        (after,) = instance.execute_requests([_request([7])])
    finally:
        instance.close()
    assert caught.value.message.startswith(
        "Failed to process the request(s) for model 'm', message: ValueError: cannot take zero"
    )
    assert str(tmp_path) not in caught.value.message
    assert isinstance(after, dict)


def test_outputs_are_checked_per_request(tmp_path: Path) -> None:
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.complex64))]),
                pb_utils.InferenceResponse([]),
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.int32))]),
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.zeros(1, np.float32))]),
            ]
    """
    instance = _load(tmp_path, code)
    try:
        no_datatype, missing, good, other = instance.execute_requests([_request([1])] * 4)
    finally:
        instance.close()
    assert isinstance(no_datatype, InternalError)
    assert "has dtype complex64, but the configuration declares TYPE_INT32" in no_datatype.message
    assert isinstance(missing, InternalError) and "returned no output 'OUT'" in missing.message
    assert isinstance(good, dict)
    # another V2 datatype than the configured one goes out as it is, as Triton sends it
    assert isinstance(other, dict) and other["OUT"].dtype == np.float32


def test_a_failing_initialize_fails_the_load(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        def initialize(self, args):
            raise RuntimeError("no weights")

        def execute(self, requests):
            return []
    """
    with pytest.raises(ModelLoadError, match="1/model.py failed to initialize: RuntimeError"):
        _load(tmp_path, code)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_bls_in_initialize_fails_the_load_with_tritons_text(
    tmp_path: Path, asynchronous: bool
) -> None:
    code = f"""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        {"async " if asynchronous else ""}def initialize(self, args):
            request = pb_utils.InferenceRequest(
                model_name="other", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.zeros(1, np.int32))],
            )
            {"await request.async_exec()" if asynchronous else "request.exec()"}

        def execute(self, requests):
            return []
    """
    with pytest.raises(ModelLoadError) as failed:
        _load(tmp_path, code)
    assert (
        "failed to initialize: TritonModelException: BLS is only supported during the "
        "'execute' function." in failed.value.message
    )


def test_bls_in_finalize_is_refused(tmp_path: Path) -> None:
    code = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    SEEN = {}

    class TritonPythonModel:
        def execute(self, requests):
            return []

        def finalize(self):
            request = pb_utils.InferenceRequest(
                model_name="other", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.zeros(1, np.int32))],
            )
            try:
                request.exec(decoupled=True)
            except pb_utils.TritonModelException as exc:
                SEEN["refused"] = str(exc)
    """
    instance = _load(tmp_path, code)
    module = instance._module  # type: ignore[attr-defined]
    instance.close()
    assert module.SEEN["refused"] == "BLS is only supported during the 'execute' function."


def test_is_ready_must_answer_a_bool(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        def execute(self, requests):
            return []

        def is_ready(self):
            return "yes"
    """
    instance = _load(tmp_path, code)
    try:
        assert instance.is_ready() is False
    finally:
        instance.close()


AUTO_COMPLETE = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
        config.set_max_batch_size(8)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        return []
"""


def test_auto_complete_config_fills_the_config(tmp_path: Path) -> None:
    config = text_format.Parse('name: "m" backend: "python"', mc.ModelConfig())
    assert PythonBackend().complete_config(_write(tmp_path, AUTO_COMPLETE), config)
    assert config.max_batch_size == 8 and config.HasField("dynamic_batching")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("IN", mc.TYPE_FP32, [4])
    ]
    assert [t.name for t in config.output] == ["OUT"]


def test_auto_complete_config_conflicts_fail_the_load(tmp_path: Path) -> None:
    config = text_format.Parse(
        'name: "m" backend: "python" input { name: "IN" data_type: TYPE_INT32 dims: [ 4 ] }',
        mc.ModelConfig(),
    )
    with pytest.raises(ModelLoadError) as caught:
        PythonBackend().complete_config(_write(tmp_path, AUTO_COMPLETE), config)
    assert "configuration expects datatype TYPE_INT32 for input 'IN', model provides " in (
        caught.value.message
    )


def test_models_without_auto_complete_config_are_left_to_the_file(tmp_path: Path) -> None:
    config = _config()
    assert not PythonBackend().complete_config(_write(tmp_path, ADD_ONE), config)
    native = "class TensorgateModel:\n    def execute(self, inputs):\n        return {}\n"
    assert not PythonBackend().complete_config(_write(tmp_path, native), config)


def test_tritonpythonmodel_must_be_a_class(tmp_path: Path) -> None:
    code = """
    class TritonPythonModel:
        def execute(self, requests):
            return []

    TritonPythonModel = 3
    """
    with pytest.raises(ModelLoadError, match="defines TritonPythonModel, but not as a class"):
        _load(tmp_path, code)


def test_not_found_code_reaches_the_server_error(tmp_path: Path) -> None:
    code = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            error = pb_utils.TritonError("no such item", pb_utils.TritonError.NOT_FOUND)
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
    """
    instance = _load(tmp_path, code)
    try:
        (result,) = instance.execute_requests([_request([1])])
    finally:
        instance.close()
    assert isinstance(result, NotFound) and result.http_status == 404
