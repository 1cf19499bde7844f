"""The KIND_GPU path of backends.python against a stand-in for CuPy that records what is done.

CI has no CUDA, so these tests check the order of things rather than CUDA itself: user code
runs with the instance's device and its own non-blocking stream current, numeric inputs are
device arrays and BYTES/BF16 stay numpy, device outputs are copied back on that stream, and the
stream is waited for before ``execute`` returns. gpu_tests/ runs the real thing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import text_format

from backends.base import ModelInstance, Placement
from backends.python import cuda
from backends.python.backend import PythonBackend
from scripts import make_models
from server.errors import InternalError, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.ipc.tensors import LentBlocks, Outbox
from server.memory.arena import ArenaAllocator
from tests.fake_cupy import FakeCupy

GPU1 = Placement(mc.ModelInstanceGroup.KIND_GPU, 1)
# Written as a GPU model is: ``import cupy`` (the stand-in here). ``cupy.events`` is the
# stand-in's log, used to see where finalize runs.
MODEL = """
import cupy
import numpy as np


class TensorgateModel:
    def initialize(self, config):
        self.placement = config["_instance"]
        self.scale = cupy.asarray(np.array(2, np.float32))  # a weight uploaded at load

    def execute(self, inputs):
        if inputs["TEXT"][0, 0] == b"fail":
            raise ValueError("asked to fail")
        x = inputs["INPUT0"]
        kinds = [type(inputs[name]).__name__ for name in ("INPUT0", "TEXT", "HALF")]
        return {
            "OUTPUT0": x * self.scale,
            "TYPES": np.array([",".join(kinds).encode()], dtype=object),
            "KIND": np.array([str(self.placement).encode()], dtype=object),
        }

    def finalize(self):
        cupy.events.append("finalize")
"""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    stand_in = FakeCupy()
    monkeypatch.setattr(cuda, "require_cupy", lambda what: stand_in)
    monkeypatch.setitem(sys.modules, "cupy", stand_in)
    return stand_in


def _config() -> mc.ModelConfig:
    return text_format.Parse(
        'name: "g" backend: "python" max_batch_size: 4 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } '
        'input { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } '
        'input { name: "HALF" data_type: TYPE_BF16 dims: [ 1 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } '
        'output { name: "TYPES" data_type: TYPE_STRING dims: [ 1 ] } '
        'output { name: "KIND" data_type: TYPE_STRING dims: [ 1 ] }',
        mc.ModelConfig(),
    )


def _load(tmp_path: Path) -> ModelInstance:
    path = make_models.write_text(MODEL, tmp_path / "g" / "1" / "model.py")
    return PythonBackend().load_instance(path, _config(), GPU1)


def _inputs(text: bytes) -> dict[str, np.ndarray]:
    return {
        "INPUT0": np.full((2, 3), 1.5, np.float32),
        "TEXT": np.array([[text], [b"b"]], dtype=object),
        "HALF": np.ones((2, 1), ml_dtypes.bfloat16),
    }


def test_load_runs_user_code_on_the_device_and_stream(tmp_path: Path, fake: FakeCupy) -> None:
    instance = _load(tmp_path)
    assert fake.events == [
        "device 1 on",
        "new stream non_blocking=True",
        "device 1 off",
        "device 1 on",
        "stream on",
        "to device float32",  # initialize's upload ...
        "synchronize",  # ... is done before the first execute
        "stream off",
        "device 1 off",
    ]
    instance.close()


def test_execute_copies_across_on_the_stream_and_waits(tmp_path: Path, fake: FakeCupy) -> None:
    instance = _load(tmp_path)
    fake.events.clear()
    result = instance.execute(_inputs(b"a"), ["OUTPUT0", "TYPES", "KIND"])
    assert fake.events == [
        "device 1 on",
        "stream on",
        "stream on",  # the join's copies are queued on the instance's stream (again)
        "H2D float32 stream",  # INPUT0 only: BYTES and BF16 stay numpy
        "stream off",
        "compute",
        "to host",
        "synchronize",
        "stream off",
        "device 1 off",
    ]
    assert isinstance(result["OUTPUT0"], np.ndarray)
    np.testing.assert_array_equal(result["OUTPUT0"], np.full((2, 3), 3.0, np.float32))
    assert result["TYPES"].tolist() == [b"FakeArray,ndarray,ndarray"]
    assert result["KIND"].tolist() == [b"{'kind': 'KIND_GPU', 'device_id': 1}"]
    fake.events.clear()
    instance.close()
    assert fake.events == [
        "device 1 on", "stream on", "finalize", "synchronize", "stream off", "device 1 off"
    ]


def test_a_large_device_output_is_copied_into_the_memory_offered(
    tmp_path: Path, fake: FakeCupy
) -> None:
    """A request run alone by the executor offers blocks of its front end's result arena: a
    device output of 64 KiB or more is copied there, once, and host outputs are left as the
    model made them."""
    instance = _load(tmp_path)
    allocator = ArenaAllocator(1 << 20)
    outbox = Outbox(np.zeros(1 << 20, np.uint8), allocator.allocate)
    lent = LentBlocks(outbox, allocator.free)
    inputs = _inputs(b"a")
    inputs["INPUT0"] = np.full((2, 8192), 1.5, np.float32)  # 64 KiB out
    fake.events.clear()
    result = instance.execute_into(inputs, ["OUTPUT0", "TYPES"], lent)
    assert fake.events.count("to host") == 1
    np.testing.assert_array_equal(result["OUTPUT0"], np.full((2, 8192), 3.0, np.float32))
    assert outbox.offset_of(result["OUTPUT0"]) is not None
    assert allocator.bytes_in_use == 1 << 16
    assert outbox.offset_of(result["TYPES"]) is None
    lent.reclaim()
    assert allocator.bytes_in_use == 0
    instance.close()


def test_a_user_error_leaves_the_device_and_stream(tmp_path: Path, fake: FakeCupy) -> None:
    instance = _load(tmp_path)
    fake.events.clear()
    with pytest.raises(InternalError, match="model 'g' failed in execute: ValueError: asked to"):
        instance.execute(_inputs(b"fail"), ["OUTPUT0"])
    # The stream is waited for even so: the request's buffers are let go of next.
    assert fake.events[-3:] == ["synchronize", "stream off", "device 1 off"]
    fake.events.clear()
    good = instance.execute(_inputs(b"a"), ["OUTPUT0"])  # the instance goes on
    np.testing.assert_array_equal(good["OUTPUT0"], np.full((2, 3), 3.0, np.float32))
    instance.close()


def test_a_device_array_is_not_taken_implicitly(tmp_path: Path, fake: FakeCupy) -> None:
    """The stand-in refuses implicit conversion as CuPy does: an output the backend did not copy
    (here one the user hid in a list) is a clear 500, not a crash."""
    code = MODEL.replace('"OUTPUT0": x * self.scale', '"OUTPUT0": [x * self.scale]')
    path = make_models.write_text(code, tmp_path / "g" / "1" / "model.py")
    instance = PythonBackend().load_instance(path, _config(), GPU1)
    with pytest.raises(InternalError, match="model 'g' output 'OUTPUT0' is not an array: list"):
        instance.execute(_inputs(b"a"), ["OUTPUT0"])
    instance.close()


def test_an_unusable_device_fails_the_load(tmp_path: Path, fake: FakeCupy) -> None:
    def no_device(device_id: int) -> None:
        raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    fake.cuda = SimpleNamespace(Device=no_device, Stream=None)
    with pytest.raises(ModelLoadError, match="CUDA device 1 is not usable: cudaErrorInvalid"):
        _load(tmp_path)


def test_a_batch_is_joined_on_the_device_from_its_parts(tmp_path: Path, fake: FakeCupy) -> None:
    """Each request's rows are copied once into their slice of one device array (no host
    concatenation); a part already on the device is copied device to device."""
    instance = _load(tmp_path)
    assert instance.joins_on_device
    fake.events.clear()
    parts: dict[str, list[Any]] = {
        "INPUT0": [
            np.full((1, 3), 1.0, np.float32),
            fake.device_array(np.full((2, 3), 2.0, np.float32)),
            np.full((1, 3), 3.0, np.float32),
        ],
        "TEXT": [np.array([[b"a"]], dtype=object), np.array([[b"b"], [b"c"]], dtype=object),
                 np.array([[b"d"]], dtype=object)],
        "HALF": [np.ones((1, 1), ml_dtypes.bfloat16), np.ones((2, 1), ml_dtypes.bfloat16),
                 np.ones((1, 1), ml_dtypes.bfloat16)],
    }
    result = instance.execute_parts(parts, ["OUTPUT0", "TYPES"])
    copies = [event for event in fake.events if event.split()[0] in ("H2D", "D2D", "to")]
    assert copies == ["H2D float32 stream", "D2D 24 stream", "H2D float32 stream", "to host"]
    np.testing.assert_array_equal(
        result["OUTPUT0"], np.repeat([[2.0], [4.0], [4.0], [6.0]], 3, axis=1).astype(np.float32)
    )
    assert result["TYPES"].tolist() == [b"FakeArray,ndarray,ndarray"]  # BYTES/BF16 on the host
    instance.close()


def test_a_lone_device_input_is_used_where_it_is(tmp_path: Path, fake: FakeCupy) -> None:
    instance = _load(tmp_path)
    fake.events.clear()
    inputs: dict[str, Any] = {
        **_inputs(b"a"), "INPUT0": fake.device_array(np.full((2, 3), 1.5, np.float32), 1)
    }
    result = instance.execute_parts({k: [v] for k, v in inputs.items()}, ["OUTPUT0"])
    assert not [event for event in fake.events if event.split()[0] in ("H2D", "D2D")]
    np.testing.assert_array_equal(result["OUTPUT0"], np.full((2, 3), 3.0, np.float32))
    instance.close()


def test_a_device_input_on_another_gpu_is_copied_to_the_instances(
    tmp_path: Path, fake: FakeCupy
) -> None:
    instance = _load(tmp_path)  # on GPU 1
    fake.events.clear()
    inputs: dict[str, Any] = {
        **_inputs(b"a"), "INPUT0": fake.device_array(np.full((2, 3), 1.5, np.float32), 0)
    }
    result = instance.execute_parts({k: [v] for k, v in inputs.items()}, ["OUTPUT0"])
    assert "D2D 24 stream" in fake.events
    np.testing.assert_array_equal(result["OUTPUT0"], np.full((2, 3), 3.0, np.float32))
    instance.close()
