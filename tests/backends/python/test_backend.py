"""Unit tests of backends.python on the CPU: loading model.py, execute, finalize, and the faults
of user code, each reported with the model's name and without the host's paths."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import ModelInstance, Placement
from backends.python.backend import PythonBackend
from scripts import make_models
from server import event_loop
from server.cuda import devices
from server.errors import InternalError, InvalidArgument, ModelLoadError
from server.generated import model_config_pb2 as mc

CPU = Placement(mc.ModelInstanceGroup.KIND_CPU)
GPU = Placement(mc.ModelInstanceGroup.KIND_GPU, 0)

SCALE = """
import numpy as np

class TensorgateModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        return {"OUTPUT0": x * np.float32(2), "EXTRA": np.zeros(3, np.float32)}
"""


@pytest.fixture
def backend() -> PythonBackend:
    return PythonBackend()


def _write(root: Path, code: str, model: str = "m", version: int = 1) -> Path:
    path = root / model / str(version) / "model.py"
    make_models.write_text(textwrap.dedent(code), path)
    return path


def _config(name: str = "m", extra: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "{name}" backend: "python" max_batch_size: 4 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } '
        'output { name: "EXTRA" data_type: TYPE_FP32 dims: [ -1 ] } '
        f"{extra}",
        mc.ModelConfig(),
    )


def _load(backend: PythonBackend, tmp_path: Path, code: str, extra: str = "") -> ModelInstance:
    return backend.load_instance(_write(tmp_path, code), _config(extra=extra), CPU)


def _load_error(backend: PythonBackend, tmp_path: Path, code: str) -> str:
    with pytest.raises(ModelLoadError) as caught:
        _load(backend, tmp_path, code)
    message = caught.value.message
    assert message.startswith("unable to load model 'm': ")
    assert str(tmp_path) not in message
    return message


def _model_modules() -> set[str]:
    return {name for name in sys.modules if name.startswith("_tensorgate_python_model_")}


# ---- the backend's identity ------------------------------------------------------------------


def test_names_and_default_file(backend: PythonBackend) -> None:
    assert (backend.name, backend.platform, backend.default_model_filename) == (
        "python",
        "",
        "model.py",
    )


def test_signature_asks_for_a_complete_config(backend: PythonBackend, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="'m'.*must declare its inputs and outputs"):
        backend.signature(_write(tmp_path, SCALE))


# ---- execute on the CPU ------------------------------------------------------------------------


def test_execute_returns_just_the_requested_outputs(
    backend: PythonBackend, tmp_path: Path
) -> None:
    instance = _load(backend, tmp_path, SCALE)
    try:
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        result = instance.execute({"INPUT0": data}, ["OUTPUT0"])
    finally:
        instance.close()
    assert list(result) == ["OUTPUT0"]
    assert isinstance(result["OUTPUT0"], np.ndarray)
    np.testing.assert_array_equal(result["OUTPUT0"], data * 2)
    assert result["OUTPUT0"].dtype == np.float32


def test_execute_gets_every_input_as_numpy(backend: PythonBackend, tmp_path: Path) -> None:
    code = """
    import numpy as np

    class TensorgateModel:
        def execute(self, inputs):
            names = ",".join(f"{k}:{type(v).__name__}:{v.dtype}" for k, v in sorted(inputs.items()))
            return {"OUTPUT0": np.array([names.encode()], dtype=object)}
    """
    config = text_format.Parse(
        'name: "m" backend: "python" '
        'input { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } '
        'input { name: "B" data_type: TYPE_STRING dims: [ 1 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] }',
        mc.ModelConfig(),
    )
    instance = backend.load_instance(_write(tmp_path, code), config, CPU)
    text = np.array([b"x"], dtype=object)
    result = instance.execute({"A": np.array([1, 2], np.int32), "B": text}, ["OUTPUT0"])
    instance.close()
    assert result["OUTPUT0"].tolist() == [b"A:ndarray:int32,B:ndarray:object"]


def test_bytes_outputs_come_back_as_object_arrays_of_bytes(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    import numpy as np

    class TensorgateModel:
        def execute(self, inputs):
            return {
                "OBJ": np.array([b"\\x00\\xff", "text"], dtype=object),
                "S": np.array([[b"ab"], [b"c"]]),
                "U": np.array(["\\u00e9", "z"]),
            }
    """
    config = text_format.Parse(
        'name: "m" backend: "python" '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } '
        'output { name: "OBJ" data_type: TYPE_STRING dims: [ 2 ] } '
        'output { name: "S" data_type: TYPE_STRING dims: [ 2, 1 ] } '
        'output { name: "U" data_type: TYPE_STRING dims: [ 2 ] }',
        mc.ModelConfig(),
    )
    instance = backend.load_instance(_write(tmp_path, code), config, CPU)
    result = instance.execute({"INPUT0": np.zeros(1, np.float32)}, ["OBJ", "S", "U"])
    instance.close()
    assert all(value.dtype == object for value in result.values())
    assert result["OBJ"].tolist() == [b"\x00\xff", "text"]
    assert result["S"].tolist() == [[b"ab"], [b"c"]]
    assert result["U"].tolist() == ["\u00e9".encode(), b"z"]


def test_config_and_placement_reach_initialize(backend: PythonBackend, tmp_path: Path) -> None:
    code = """
    import json
    import numpy as np

    class TensorgateModel:
        def initialize(self, config):
            self.config = json.dumps(config)

        def execute(self, inputs):
            return {"OUTPUT0": np.array([self.config.encode()], dtype=object)}
    """
    config = text_format.Parse(
        'name: "m" backend: "python" max_batch_size: 8 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } '
        'parameters { key: "scale" value: { string_value: "3" } }',
        mc.ModelConfig(),
    )
    instance = backend.load_instance(_write(tmp_path, code), config, CPU)
    result = instance.execute({"INPUT0": np.zeros((1, 1), np.float32)}, ["OUTPUT0"])
    instance.close()
    seen = json.loads(result["OUTPUT0"][0])
    assert seen["name"] == "m"
    assert seen["backend"] == "python"
    assert seen["max_batch_size"] == 8
    assert [tensor["name"] for tensor in seen["input"]] == ["INPUT0"]
    assert seen["input"][0]["data_type"] == "TYPE_FP32"
    assert seen["input"][0]["dims"] == [-1]  # int64 as a JSON number, as /config prints it
    assert seen["parameters"] == {"scale": {"string_value": "3"}}
    assert seen["_instance"] == {"kind": "KIND_CPU", "device_id": 0}


def test_model_file_knows_its_own_location(backend: PythonBackend, tmp_path: Path) -> None:
    """``__file__`` is set, so a model can read files beside it (weights, vocabularies)."""
    code = """
    from pathlib import Path
    import numpy as np

    FACTOR = float(Path(__file__).with_name("factor.txt").read_text())

    class TensorgateModel:
        def execute(self, inputs):
            return {"OUTPUT0": inputs["INPUT0"] * np.float32(FACTOR)}
    """
    path = _write(tmp_path, code)
    make_models.write_text("5\n", path.with_name("factor.txt"))
    instance = backend.load_instance(path, _config(), CPU)
    result = instance.execute({"INPUT0": np.ones((1, 2), np.float32)}, ["OUTPUT0"])
    instance.close()
    np.testing.assert_array_equal(result["OUTPUT0"], [[5, 5]])


def test_no_bytecode_is_written_into_the_repository(
    backend: PythonBackend, tmp_path: Path
) -> None:
    path = _write(tmp_path, SCALE)
    backend.load_instance(path, _config(), CPU).close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.py"]


def test_instances_have_separate_modules_and_objects(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    import numpy as np

    CALLS = []  # module state: one module per instance

    class TensorgateModel:
        def __init__(self):
            self.calls = 0

        def execute(self, inputs):
            self.calls += 1
            CALLS.append(1)
            return {"OUTPUT0": np.array([self.calls, len(CALLS)], np.float32)}
    """
    path = _write(tmp_path, code)
    before = _model_modules()
    first = backend.load_instance(path, _config(), CPU)
    second = backend.load_instance(path, _config(), CPU)
    loaded = _model_modules() - before
    assert len(loaded) == 2
    data = {"INPUT0": np.zeros(1, np.float32)}
    for _ in range(3):
        first.execute(data, ["OUTPUT0"])
    result = second.execute(data, ["OUTPUT0"])
    assert result["OUTPUT0"].tolist() == [1, 1]
    assert first.execute(data, ["OUTPUT0"])["OUTPUT0"].tolist() == [4, 4]
    first.close()
    second.close()
    assert not loaded & _model_modules()  # unloading forgets the modules


def test_finalize_is_called_on_close(backend: PythonBackend, tmp_path: Path) -> None:
    code = """
    from pathlib import Path

    class TensorgateModel:
        def execute(self, inputs):
            return {}

        def finalize(self):
            with open(Path(__file__).with_name("finalized"), "a") as f:
                f.write("x")
    """
    instance = _load(backend, tmp_path, code)
    marker = tmp_path / "m" / "1" / "finalized"
    assert not marker.exists()
    instance.close()
    assert marker.read_text() == "x"


def test_a_failing_finalize_is_logged_not_raised(
    backend: PythonBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = """
    class TensorgateModel:
        def execute(self, inputs):
            return {}

        def finalize(self):
            raise RuntimeError("cannot let go")
    """
    before = _model_modules()
    instance = _load(backend, tmp_path, code)
    with caplog.at_level(logging.ERROR):
        instance.close()
    assert "model 'm': finalize failed" in caplog.text
    assert "cannot let go" in caplog.text
    assert _model_modules() == before


# ---- faults at load ----------------------------------------------------------------------------


def test_missing_class(backend: PythonBackend, tmp_path: Path) -> None:
    message = _load_error(backend, tmp_path, "class Model:\n    pass\n")
    assert "1/model.py must define a class named TensorgateModel" in message


def test_class_without_execute(backend: PythonBackend, tmp_path: Path) -> None:
    message = _load_error(backend, tmp_path, "class TensorgateModel:\n    pass\n")
    assert "has no execute(inputs) method" in message


def test_import_error(backend: PythonBackend, tmp_path: Path) -> None:
    before = _model_modules()
    message = _load_error(backend, tmp_path, "import no_such_module_here\n")
    assert "1/model.py failed to import: ModuleNotFoundError:" in message
    assert "no_such_module_here" in message
    assert _model_modules() == before


def test_syntax_error(backend: PythonBackend, tmp_path: Path) -> None:
    message = _load_error(backend, tmp_path, "class TensorgateModel(:\n")
    assert "1/model.py failed to import: SyntaxError:" in message


def test_initialize_error_names_the_model_not_the_host_path(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    from pathlib import Path

    class TensorgateModel:
        def initialize(self, config):
            Path(__file__).with_name("weights.bin").read_bytes()

        def execute(self, inputs):
            return {}
    """
    before = _model_modules()
    message = _load_error(backend, tmp_path, code)
    assert "1/model.py failed to initialize: FileNotFoundError:" in message
    assert "m/1/weights.bin" in message  # the folder's host path became the model's name
    assert _model_modules() == before


def test_constructor_error(backend: PythonBackend, tmp_path: Path) -> None:
    code = """
    class TensorgateModel:
        def __init__(self):
            raise ValueError("no")

        def execute(self, inputs):
            return {}
    """
    message = _load_error(backend, tmp_path, code)
    assert "failed to initialize: ValueError: no" in message


def test_gpu_instance_refused_without_cuda(
    backend: PythonBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "cupy_module", lambda: None)
    code = """
    from pathlib import Path

    Path(__file__).with_name("imported").write_text("yes")

    class TensorgateModel:
        def execute(self, inputs):
            return {}
    """
    path = _write(tmp_path, code)
    with pytest.raises(ModelLoadError, match="KIND_GPU.* needs a CUDA device and CuPy"):
        backend.load_instance(path, _config(), GPU)
    assert not path.with_name("imported").exists()  # refused before running any user code


# ---- faults at execute -----------------------------------------------------------------------


def test_execute_error_is_a_500_and_the_instance_goes_on(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    import numpy as np

    class TensorgateModel:
        def execute(self, inputs):
            x = inputs["INPUT0"]
            if (x < 0).any():
                raise ValueError("negative input")
            return {"OUTPUT0": x}
    """
    instance = _load(backend, tmp_path, code)
    with pytest.raises(InternalError) as caught:
        instance.execute({"INPUT0": np.array([-1.0], np.float32)}, ["OUTPUT0"])
    assert caught.value.http_status == 500
    assert caught.value.message == "model 'm' failed in execute: ValueError: negative input"
    good = instance.execute({"INPUT0": np.array([1.0], np.float32)}, ["OUTPUT0"])
    assert good["OUTPUT0"].tolist() == [1.0]
    instance.close()


def test_a_server_error_from_the_model_keeps_its_status(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    from server.errors import InvalidArgument

    class TensorgateModel:
        def execute(self, inputs):
            raise InvalidArgument("INPUT0 must be sorted")
    """
    instance = _load(backend, tmp_path, code)
    with pytest.raises(InvalidArgument, match="INPUT0 must be sorted"):
        instance.execute({"INPUT0": np.zeros(1, np.float32)}, ["OUTPUT0"])
    instance.close()


def _execute_error(backend: PythonBackend, tmp_path: Path, returned: str) -> str:
    code = f"""
    import numpy as np

    class TensorgateModel:
        def execute(self, inputs):
            return {returned}
    """
    instance = _load(backend, tmp_path, code)
    try:
        with pytest.raises(InternalError) as caught:
            instance.execute({"INPUT0": np.zeros(2, np.float32)}, ["OUTPUT0", "EXTRA"])
    finally:
        instance.close()
    return caught.value.message


def test_missing_output(backend: PythonBackend, tmp_path: Path) -> None:
    message = _execute_error(backend, tmp_path, '{"OUTPUT0": inputs["INPUT0"]}')
    assert message == (
        "model 'm' execute did not return output(s) ['EXTRA'] (it returned ['OUTPUT0'])"
    )


def test_wrong_return_type(backend: PythonBackend, tmp_path: Path) -> None:
    message = _execute_error(backend, tmp_path, '[inputs["INPUT0"]]')
    assert message == (
        "model 'm' execute returned list, expected a dict of output name to array"
    )


def test_output_of_another_dtype(backend: PythonBackend, tmp_path: Path) -> None:
    message = _execute_error(
        backend,
        tmp_path,
        '{"OUTPUT0": inputs["INPUT0"].astype(np.float64), "EXTRA": inputs["INPUT0"]}',
    )
    assert "output 'OUTPUT0' has dtype float64" in message
    assert "declares TYPE_FP32" in message
    message = _execute_error(
        backend, tmp_path, '{"OUTPUT0": inputs["INPUT0"], "EXTRA": np.array([b"a"], object)}'
    )
    assert "output 'EXTRA' has dtype object" in message


def test_output_that_is_not_an_array(backend: PythonBackend, tmp_path: Path) -> None:
    message = _execute_error(
        backend, tmp_path, '{"OUTPUT0": inputs["INPUT0"], "EXTRA": [[1.0], [2.0, 3.0]]}'
    )
    assert message.startswith("model 'm' output 'EXTRA' is not an array: list")


def test_sys_exit_in_user_code_fails_the_batch_or_load_not_the_server(
    backend: PythonBackend, tmp_path: Path
) -> None:
    code = """
    import sys

    class TensorgateModel:
        def execute(self, inputs):
            sys.exit(3)
    """
    instance = _load(backend, tmp_path, code)
    with pytest.raises(InternalError, match="failed in execute: SystemExit: 3"):
        instance.execute({"INPUT0": np.array([1.0], np.float32)}, ["OUTPUT0"])
    instance.close()
    message = _load_error(backend, tmp_path / "b", "import sys\nsys.exit('bye')\n")
    assert "failed to import" in message and "SystemExit" in message
    message = _load_error(
        backend,
        tmp_path / "c",
        "class TensorgateModel:\n    def initialize(self, config):\n        raise KeyboardInterrupt\n"
        "    def execute(self, inputs):\n        return {}\n",
    )
    assert "failed to initialize" in message and "KeyboardInterrupt" in message


def test_user_code_never_runs_on_the_event_loop(backend: PythonBackend, tmp_path: Path) -> None:
    """Fast model code would be run inline by the runner after warm-up; Python models opt out,
    so asyncio inside execute keeps working."""
    from server.scheduling.runner import InstanceRunner

    code = """
    import asyncio
    import threading

    class TensorgateModel:
        def execute(self, inputs):
            asyncio.run(asyncio.sleep(0))  # fails on a thread that runs an event loop
            return {"OUTPUT0": inputs["INPUT0"], "THREAD": threading.current_thread().name}
    """
    instance = _load(backend, tmp_path, code)
    assert instance.may_run_inline is False
    runner = InstanceRunner("py", instance)

    async def many() -> None:
        for _ in range(30):
            got = await runner.run({"INPUT0": np.array([1.0], np.float32)}, ["OUTPUT0"])
            assert got["OUTPUT0"].tolist() == [1.0]

    event_loop.run(many())
    runner.close()
