"""Unit tests for backends.onnxruntime.backend on small identity models of every V2 datatype."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format

from backends.base import ModelInstance, Placement, TensorInfo
from backends.onnxruntime.backend import NO_SPINNING, OnnxRuntimeBackend, direct_run
from scripts import make_models
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from tests.sequence_models import SIMPLE_STRING_DYNA_SEQUENCE, string_dyna_sequence_model

DT = datatypes.BY_NAME
CPU = Placement(mc.ModelInstanceGroup.KIND_CPU)
OPTIONS = {"intra_op_thread_count": "1"}


@pytest.fixture(scope="module")
def backend() -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(OPTIONS)


@pytest.fixture(scope="module")
def identity_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``<repo>/id_<type>/1/model.onnx``: identity [batch, -1] for every V2 datatype."""
    root = tmp_path_factory.mktemp("ort_models")
    paths = {}
    for name in make_models.V2_DATATYPES:
        path = root / f"id_{name.lower()}" / "1" / "model.onnx"
        make_models.save(make_models.identity(name, ["batch", -1]), path)
        paths[name] = path
    return paths


def _config(
    name: str, datatype: str, dims: str = "[ -1 ]", max_batch: int = 4, extra: str = ""
) -> mc.ModelConfig:
    config_type = DT[datatype].config_name
    return text_format.Parse(
        f'name: "{name}" max_batch_size: {max_batch} '
        f'input {{ name: "INPUT0" data_type: {config_type} dims: {dims} }} '
        f'output {{ name: "OUTPUT0" data_type: {config_type} dims: {dims} }} {extra}',
        mc.ModelConfig(),
    )


def _sample(name: str) -> np.ndarray:
    """A [2, 3] tensor of ``name`` with awkward values."""
    if name == "BYTES":
        out = np.empty(6, dtype=object)
        out[:] = [b"\x00\xff", b"", b"text", b"\xff", "\u00e9".encode(), b"a\x00"]
        return out.reshape(2, 3)
    if name == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    dtype = DT[name].dtype
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, 2, info.max - 1]], dtype=dtype)
    if name == "BF16":
        return np.array([[1.5, -2.0, 3.0e38], [0.0078125, -0.0, 1e-30]], dtype=ml_dtypes.bfloat16)
    finfo = np.finfo(dtype)
    return np.array([[finfo.max, finfo.min, 0.1], [-0.0, finfo.tiny, 1.0]], dtype=dtype)


def _load(backend: OnnxRuntimeBackend, path: Path, config: mc.ModelConfig) -> ModelInstance:
    return backend.load_instance(path, config, CPU)


def test_backend_identity_fields() -> None:
    assert OnnxRuntimeBackend.name == "onnxruntime"
    assert OnnxRuntimeBackend.platform == "onnxruntime_onnx"
    assert OnnxRuntimeBackend.default_model_filename == "model.onnx"


# ---- signature ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", make_models.V2_DATATYPES)
def test_signature_every_datatype(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path], name: str
) -> None:
    signature = backend.signature(identity_models[name])
    assert signature.inputs == (TensorInfo("INPUT0", DT[name], (-1, -1)),)
    assert signature.outputs == (TensorInfo("OUTPUT0", DT[name], (-1, -1)),)
    assert signature.inputs[0].datatype is DT[name]


def test_signature_fixed_and_scalar_dims(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    fixed = make_models.save(
        make_models.identity("INT8", [3, 5]), tmp_path / "f" / "1" / "model.onnx"
    )
    assert backend.signature(fixed).inputs[0].shape == (3, 5)
    scalar = make_models.save(make_models.identity("FP32", []), tmp_path / "s" / "1" / "model.onnx")
    assert backend.signature(scalar).inputs[0].shape == ()


def test_signature_order_of_several_tensors(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    path = make_models.save(make_models.add_sub("FP32", 16), tmp_path / "a" / "1" / "model.onnx")
    signature = backend.signature(path)
    assert [t.name for t in signature.inputs] == ["INPUT0", "INPUT1"]
    assert [t.name for t in signature.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert all(t.shape == (-1, 16) for t in signature.inputs + signature.outputs)


def test_signature_of_a_corrupt_file(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    path = tmp_path / "bad" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00garbage")
    with pytest.raises(ModelLoadError, match="^unable to load model 'bad': "):
        backend.signature(path)


def test_signature_of_a_missing_file(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unable to load model"):
        backend.signature(tmp_path / "none" / "1" / "model.onnx")


# ---- execute, every datatype ---------------------------------------------------------------


@pytest.mark.parametrize("name", make_models.V2_DATATYPES)
def test_identity_every_datatype(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path], name: str
) -> None:
    instance = _load(backend, identity_models[name], _config(f"id_{name.lower()}", name))
    data = _sample(name)
    try:
        result = instance.execute({"INPUT0": data}, ["OUTPUT0"])
    finally:
        instance.close()
    assert list(result) == ["OUTPUT0"]
    out = result["OUTPUT0"]
    assert out.shape == data.shape
    assert out.dtype == data.dtype
    if name == "BYTES":
        assert out.tolist() == data.tolist()
        assert all(type(item) is bytes for item in out.reshape(-1))
    else:
        # byte-exact, NaN-free samples: compare the raw bytes
        assert out.tobytes() == data.tobytes()


def test_bytes_with_nul_and_ff_byte_exact(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    items = [b"\x00\xff", b"\x00", b"\xff", b"", b"\xff\x00\xfe\x00", bytes(range(256))]
    data = np.empty((len(items), 1), dtype=object)
    data[:, 0] = items
    instance = _load(backend, identity_models["BYTES"], _config("b", "BYTES"))
    out = instance.execute({"INPUT0": data}, ["OUTPUT0"])["OUTPUT0"]
    assert out.reshape(-1).tolist() == items
    # the caller's array is untouched
    assert data[:, 0].tolist() == items


def test_bf16_exact_including_nan_and_inf(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    raw = np.array([[0x3FC0, 0x7F80, 0xFF80, 0x7FC1, 0x0001, 0x8000]], dtype=np.uint16)
    data = raw.view(ml_dtypes.bfloat16)
    instance = _load(backend, identity_models["BF16"], _config("bf", "BF16"))
    out = instance.execute({"INPUT0": data}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    assert out.shape == (1, 6)
    assert out.view(np.uint16).tolist() == raw.tolist()


def test_bf16_non_contiguous_input(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    full = np.arange(12, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(3, 4)
    data = full.T  # not C-contiguous
    instance = _load(backend, identity_models["BF16"], _config("bf", "BF16"))
    out = instance.execute({"INPUT0": data}, ["OUTPUT0"])["OUTPUT0"]
    assert out.astype(np.float32).tolist() == data.astype(np.float32).tolist()


def test_fp16_values(backend: OnnxRuntimeBackend, identity_models: dict[str, Path]) -> None:
    data = np.array([[65504.0, -65504.0, 6.1e-5, 0.333, np.inf, -0.0]], dtype=np.float16)
    instance = _load(backend, identity_models["FP16"], _config("h", "FP16"))
    out = instance.execute({"INPUT0": data}, ["OUTPUT0"])["OUTPUT0"]
    assert out.dtype == np.float16
    assert out.tobytes() == data.tobytes()


def test_add_sub_two_outputs_in_requested_order(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    path = make_models.save(make_models.add_sub("INT32", 4), tmp_path / "s" / "1" / "model.onnx")
    config = text_format.Parse(
        'name: "s" max_batch_size: 8 '
        'input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } '
        'input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } '
        'output { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] }',
        mc.ModelConfig(),
    )
    instance = _load(backend, path, config)
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.int32)
    b = np.ones((2, 4), dtype=np.int32)
    result = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT1", "OUTPUT0"])
    assert list(result) == ["OUTPUT1", "OUTPUT0"]
    assert result["OUTPUT0"].tolist() == (a + b).tolist()
    assert result["OUTPUT1"].tolist() == (a - b).tolist()
    only = instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT1"])
    assert list(only) == ["OUTPUT1"]


def test_config_parameters_are_applied(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    extra = (
        'parameters { key: "intra_op_thread_count" value { string_value: "1" } } '
        'parameters { key: "execution_mode" value { string_value: "0" } } '
        'parameters { key: "enable_mem_arena" value { string_value: "0" } } '
        "optimization { graph { level: 2 } }"
    )
    instance = _load(backend, identity_models["FP32"], _config("p", "FP32", extra=extra))
    data = np.ones((1, 2), dtype=np.float32)
    assert instance.execute({"INPUT0": data}, ["OUTPUT0"])["OUTPUT0"].tolist() == [[1.0, 1.0]]


def test_no_session_spins_whatever_its_thread_counts(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    extra = 'parameters { key: "intra_op_thread_count" value { string_value: "2" } }'
    instance = _load(backend, identity_models["FP32"], _config("p", "FP32", extra=extra))
    options = instance._session.get_session_options()  # type: ignore[attr-defined]
    for key in NO_SPINNING:
        assert options.get_session_config_entry(key) == "0"


def test_invalid_parameter_value(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    extra = 'parameters { key: "intra_op_thread_count" value { string_value: "many" } }'
    with pytest.raises(ModelLoadError, match="^invalid ONNX Runtime parameter for 'p': "):
        _load(backend, identity_models["FP32"], _config("p", "FP32", extra=extra))


def test_invalid_backend_option() -> None:
    backend = OnnxRuntimeBackend({"inter_op_thread_count": "x"})
    config = _config("p", "FP32")
    with pytest.raises(ModelLoadError, match="invalid ONNX Runtime parameter"):
        backend.load_instance(Path("/nonexistent/model.onnx"), config, CPU)


# ---- load_instance refusals -------------------------------------------------------------------


def test_gpu_placement_refused(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    gpu = Placement(mc.ModelInstanceGroup.KIND_GPU, 0)
    assert gpu.is_gpu and not CPU.is_gpu
    with pytest.raises(ModelLoadError) as err:
        backend.load_instance(identity_models["FP32"], _config("g", "FP32"), gpu)
    assert str(err.value).startswith(
        "unable to load model 'g': instance group KIND_GPU needs a CUDA"
    )


def test_config_input_not_in_model(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    config = _config("m", "FP32")
    config.input[0].name = "OTHER"
    with pytest.raises(ModelLoadError) as err:
        _load(backend, identity_models["FP32"], config)
    assert str(err.value) == (
        "unable to load model 'm': configuration expects input 'OTHER' but the model has ['INPUT0']"
    )


def test_config_output_not_in_model(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    config = _config("m", "FP32")
    config.output[0].name = "NOPE"
    with pytest.raises(ModelLoadError) as err:
        _load(backend, identity_models["FP32"], config)
    assert str(err.value) == (
        "unable to load model 'm': configuration expects output 'NOPE' but the model has ['OUTPUT0']"
    )


def test_config_datatype_mismatch(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    config = _config("m", "FP32")
    config.input[0].data_type = mc.TYPE_FP64
    with pytest.raises(ModelLoadError) as err:
        _load(backend, identity_models["FP32"], config)
    assert str(err.value) == (
        "unable to load model 'm': input 'INPUT0' has datatype TYPE_FP32 in the model but "
        "TYPE_FP64 in the configuration"
    )


def test_model_input_missing_from_config(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    path = make_models.save(make_models.add_sub("FP32", 4), tmp_path / "s" / "1" / "model.onnx")
    config = text_format.Parse(
        'name: "s" max_batch_size: 8 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } '
        'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }',
        mc.ModelConfig(),
    )
    with pytest.raises(ModelLoadError) as err:
        _load(backend, path, config)
    assert str(err.value) == (
        "unable to load model 's': model input 'INPUT1' is missing from the configuration"
    )


def test_subset_of_outputs_in_config_is_fine(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    path = make_models.save(make_models.add_sub("FP32", 4), tmp_path / "s" / "1" / "model.onnx")
    config = text_format.Parse(
        'name: "s" max_batch_size: 8 '
        'input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } '
        'input { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } '
        'output { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }',
        mc.ModelConfig(),
    )
    instance = _load(backend, path, config)
    ones = np.ones((1, 4), dtype=np.float32)
    assert instance.execute({"INPUT0": ones, "INPUT1": ones}, ["OUTPUT1"])["OUTPUT1"].tolist() == [
        [0.0] * 4
    ]


def test_corrupt_model_file_refused(backend: OnnxRuntimeBackend, tmp_path: Path) -> None:
    path = tmp_path / "c" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not onnx")
    with pytest.raises(ModelLoadError, match="^unable to load model 'c': "):
        _load(backend, path, _config("c", "FP32"))


def test_model_fault_raises_at_execute(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["FP32"], _config("m", "FP32"))
    with pytest.raises(Exception, match="Invalid rank for input: INPUT0"):  # ORT's own types
        instance.execute(
            {"INPUT0": np.ones((2,), dtype=np.float32)}, ["OUTPUT0"]
        )  # rank 1, model wants 2


def _add_sub_session(tmp_path: Path) -> ort.InferenceSession:
    path = make_models.save(make_models.add_sub("INT32", 4), tmp_path / "s" / "1" / "model.onnx")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_direct_run_answers_as_the_session_does(tmp_path: Path) -> None:
    session = _add_sub_session(tmp_path)
    feeds = {"INPUT0": np.arange(8, dtype=np.int32).reshape(2, 4),
             "INPUT1": np.full((2, 4), 3, dtype=np.int32)}
    direct = direct_run(session)
    assert direct != session.run  # the compiled session was found: not the public method
    ours = direct(["OUTPUT1", "OUTPUT0"], feeds)
    theirs = session.run(["OUTPUT1", "OUTPUT0"], feeds)
    assert [a.tolist() for a in ours] == [a.tolist() for a in theirs]


def test_direct_run_still_refuses_a_missing_input(tmp_path: Path) -> None:
    direct = direct_run(_add_sub_session(tmp_path))
    one = np.ones((1, 4), dtype=np.int32)
    with pytest.raises(Exception, match="INPUT1"):  # the compiled run's own refusal
        direct(["OUTPUT0"], {"INPUT0": one})
    # and the session goes on answering complete requests
    assert direct(["OUTPUT0"], {"INPUT0": one, "INPUT1": one})[0].tolist() == [[2, 2, 2, 2]]


def test_direct_run_without_the_compiled_session_is_the_public_run() -> None:
    class Wrapper:
        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return [np.zeros(1)]

    wrapper = Wrapper()
    assert direct_run(wrapper) == wrapper.run


def test_a_provider_failure_goes_to_the_public_run_and_its_fallback() -> None:
    calls: list[str] = []

    class Compiled:
        def run(self, names: list[str], feeds: object, options: object) -> list[np.ndarray]:
            calls.append("compiled")
            raise ort.capi.onnxruntime_pybind11_state.EPFail("the provider failed")

    class Wrapper:
        _sess = Compiled()

        def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            calls.append("public")
            return [np.ones(1)]

    result = direct_run(Wrapper())(["OUTPUT0"], {})
    assert calls == ["compiled", "public"] and result[0].tolist() == [1.0]


def _sequence_config(corrid: str, state_output: str) -> mc.ModelConfig:
    text = SIMPLE_STRING_DYNA_SEQUENCE.format().replace("TYPE_STRING", corrid)
    return text_format.Parse(text.replace('"ACC_OUT"', f'"{state_output}"'), mc.ModelConfig())


def test_sequence_control_and_state_tensors_are_checked(
    backend: OnnxRuntimeBackend, tmp_path: Path
) -> None:
    """Controls and states are model inputs the config does not declare; they must exist in
    the model with the datatypes the config gives them."""
    path = make_models.save(string_dyna_sequence_model(), tmp_path / "q" / "1" / "model.onnx")
    instance = _load(backend, path, _sequence_config("TYPE_STRING", "ACC_OUT"))
    instance.close()
    with pytest.raises(ModelLoadError) as err:
        _load(backend, path, _sequence_config("TYPE_UINT64", "ACC_OUT"))
    assert str(err.value) == (
        "unable to load model 'simple_string_dyna_sequence': sequence batching input 'CORRID' "
        "has datatype TYPE_STRING in the model but TYPE_UINT64 in the configuration"
    )
    with pytest.raises(ModelLoadError) as err:
        _load(backend, path, _sequence_config("TYPE_STRING", "NOT_THERE"))
    assert str(err.value) == (
        "unable to load model 'simple_string_dyna_sequence': sequence batching state output "
        "'NOT_THERE' is not a tensor of the model (it has ['ACC_OUT', 'OUTPUT'])"
    )


# --- outputs written into memory the caller offers (execute_into) ----------------------------


class Memory:
    """An ``OutputMemory`` that hands out arrays filled with a marker, or none."""

    def __init__(self, room: bool = True) -> None:
        self.room = room
        self.given: list[np.ndarray] = []

    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        if not self.room:
            return None
        array = np.full(shape, 7, dtype=dtype)
        self.given.append(array)
        return array


def _doubling_model(path: Path) -> Path:
    """OUTPUT0 = Concat(INPUT0, INPUT0) on axis 0, declared [n] like its input [n]: a graph
    whose dimension names promise a shape its run does not keep."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Concat", ["INPUT0", "INPUT0"], ["OUTPUT0"], axis=0)],
        "doubling",
        [helper.make_tensor_value_info("INPUT0", onnx.TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = make_models.IR_VERSION
    return make_models.save(model, path)


def test_large_outputs_are_written_into_the_memory_offered(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["FP32"], _config("m", "FP32"))
    data = np.random.default_rng(0).random((4, 16384), dtype=np.float32)  # 256 KiB
    memory = Memory()
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], memory)
    (given,) = memory.given
    assert out["OUTPUT0"] is given
    assert np.array_equal(given, data)


def test_small_outputs_are_not_bound_to_the_memory_offered(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["FP32"], _config("m", "FP32"))
    data = np.arange(12, dtype=np.float32).reshape(2, 6)
    memory = Memory()
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], memory)
    assert memory.given == []
    assert np.array_equal(out["OUTPUT0"], data)


def test_without_room_the_run_writes_its_own_memory(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["FP32"], _config("m", "FP32"))
    data = np.random.default_rng(1).random((4, 16384), dtype=np.float32)
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], Memory(room=False))
    assert np.array_equal(out["OUTPUT0"], data)


def test_bytes_outputs_are_never_bound(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["BYTES"], _config("m", "BYTES"))
    data = np.array([[b"x" * 70000]], dtype=object)
    memory = Memory()
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], memory)
    assert memory.given == []
    assert out["OUTPUT0"][0, 0] == data[0, 0]


def test_a_graph_breaking_its_dimension_names_runs_as_usual_and_is_trusted_no_more(
    backend: OnnxRuntimeBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _doubling_model(tmp_path / "doubling" / "1" / "model.onnx")
    instance = _load(backend, path, _config("doubling", "FP32", max_batch=0))
    data = np.arange(32768, dtype=np.float32)  # 128 KiB: bound, if the names were believed
    memory = Memory()
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], memory)
    assert np.array_equal(out["OUTPUT0"], np.concatenate([data, data]))
    assert len(memory.given) == 1  # tried once; the caller reclaims it
    assert "outputs are copied from now on" in caplog.text
    out = instance.execute_into({"INPUT0": data}, ["OUTPUT0"], memory)
    assert np.array_equal(out["OUTPUT0"], np.concatenate([data, data]))
    assert len(memory.given) == 1  # not tried again


def test_a_model_fault_through_execute_into_raises(
    backend: OnnxRuntimeBackend, identity_models: dict[str, Path]
) -> None:
    instance = _load(backend, identity_models["FP32"], _config("m", "FP32"))
    memory = Memory()
    wrong_type = np.ones((4, 16384), dtype=np.float64)  # shapes resolve; the runs both fail
    with pytest.raises(Exception, match="Unexpected input data type"):
        instance.execute_into({"INPUT0": wrong_type}, ["OUTPUT0"], memory)
    assert len(memory.given) == 1  # the bound run was tried first
