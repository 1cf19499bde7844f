"""Unit tests for server.repository.loader: one model folder -> served versions (no server)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from scripts import make_models
from server import event_loop
from server.generated import model_config_pb2 as mc
from server.repository import loader
from server.repository.loader import Model, State
from server.scheduling.batcher import DynamicBatcher
from server.scheduling.job import Job, Scheduler
from server.settings import Settings

IDENTITY_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input {{ name: "{input}" data_type: TYPE_FP32 dims: [ 4 ] }}
output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}
instance_group {{ kind: KIND_CPU count: 1 }}
{extra}
"""


def _identity(
    root: Path,
    name: str,
    version: int = 1,
    dims: list[int | str] | None = None,
    dtype: str = "FP32",
) -> None:
    model = make_models.identity(dtype, dims if dims is not None else [4])
    make_models.save(model, root / name / str(version) / "model.onnx")


def _write_config(root: Path, name: str, text: str) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(text)


def _run(
    scheduler: Scheduler, inputs: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    rows = next(iter(inputs.values())).shape[0] if inputs else 1
    return event_loop.run(scheduler.execute(Job(inputs, outputs, rows=rows)))


# ---- success --------------------------------------------------------------------------------


def test_autocompleted_model_is_ready(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "ident", dims=["batch", -1])
    model = load("ident")
    assert model.reason == ""
    assert model.ready
    assert model.ready_versions() == [1]
    version = model.versions[1]
    assert version.state is State.READY
    assert version.reason == ""
    assert isinstance(version.scheduler, DynamicBatcher)  # auto-complete adds dynamic_batching
    config = model.config
    assert config is not None and version.config is config
    assert config.name == "ident"
    assert config.backend == "onnxruntime"
    assert config.platform == "onnxruntime_onnx"
    assert config.default_model_filename == "model.onnx"
    assert config.max_batch_size == 4
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", mc.TYPE_FP32, [-1])
    ]
    assert config.version_policy.latest.num_versions == 1
    group = config.instance_group[0]
    assert (group.name, group.kind, group.count) == ("ident", mc.ModelInstanceGroup.KIND_CPU, 2)
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = _run(version.scheduler, {"INPUT0": data}, ["OUTPUT0"])
    assert np.array_equal(result["OUTPUT0"], data)


def test_model_with_config_is_ready_and_runs(tmp_path: Path, load: Callable[..., Model]) -> None:
    make_models.save(make_models.add_sub("INT32", 16), tmp_path / "simple" / "1" / "model.onnx")
    _write_config(
        tmp_path,
        "simple",
        make_models.config_pbtxt(
            "simple",
            8,
            inputs=[("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])],
            outputs=[("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])],
        ),
    )
    model = load("simple")
    assert model.ready, model.reason
    config = model.config
    assert config is not None
    assert config.max_batch_size == 8
    assert config.WhichOneof("scheduling_choice") is None  # complete config: not auto-completed
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    scheduler = model.versions[1].scheduler
    assert scheduler is not None
    result = _run(scheduler, {"INPUT0": a, "INPUT1": b}, ["OUTPUT1", "OUTPUT0"])
    assert result["OUTPUT0"].tolist() == (a + b).tolist()
    assert result["OUTPUT1"].tolist() == (a - b).tolist()


def test_latest_policy_loads_only_the_newest(tmp_path: Path, load: Callable[..., Model]) -> None:
    for version in (1, 3, 2):
        _identity(tmp_path, "m", version)
    model = load("m")
    assert sorted(model.versions) == [3]
    assert model.ready


def test_all_policy_loads_every_version(tmp_path: Path, load: Callable[..., Model]) -> None:
    for version in (1, 2):
        _identity(tmp_path, "m", version)
    _write_config(tmp_path, "m", "version_policy { all { } }\n")
    model = load("m")
    assert model.ready_versions() == [1, 2]


def test_backend_config_default_max_batch_size(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m", dims=["batch", 4])
    settings = Settings(backend_config={"onnxruntime": {"default-max-batch-size": "16"}})
    model = load("m", settings)
    assert model.config is not None and model.config.max_batch_size == 16


def test_backend_found_by_platform_only(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", 'platform: "onnxruntime_onnx"\n')
    model = load("m")
    assert model.ready
    assert model.config is not None and model.config.backend == "onnxruntime"


# ---- refusals ---------------------------------------------------------------------------------


def test_config_name_mismatch(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "dirname")
    _write_config(tmp_path, "dirname", 'name: "other"\n')
    model = load("dirname")
    assert not model.ready
    assert model.config is None
    assert model.versions == {}
    assert model.reason == (
        "unexpected directory name 'dirname' for model 'other', directory name must equal model name"
    )


def test_unknown_backend(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", 'backend: "tensorflow"\n')
    model = load("m")
    assert not model.ready and model.versions == {}
    assert model.reason == "unsupported backend 'tensorflow' for model 'm'"


def test_unknown_platform(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", 'platform: "tensorrt_plan"\n')
    model = load("m")
    assert model.reason == "unsupported platform 'tensorrt_plan' for model 'm'"


def test_platform_backend_mismatch(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", 'backend: "onnxruntime" platform: "pytorch_libtorch"\n')
    model = load("m")
    assert (
        model.reason
        == "platform 'pytorch_libtorch' does not match backend 'onnxruntime' for model 'm'"
    )


def test_no_backend_can_be_found(tmp_path: Path, load: Callable[..., Model]) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.pt").write_bytes(b"")
    model = load("m")
    assert not model.ready
    assert model.reason.startswith("unable to find a backend for model 'm'")


def test_a_fault_while_preparing_a_config_fails_that_model_only(
    tmp_path: Path, load: Callable[..., Model], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (not a refusal) while a model's config is prepared fails that model's load with
    the fault as its reason, instead of escaping and ending the start-up."""
    _identity(tmp_path, "m")

    def broken(config: object, model_dir: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(loader, "read_labels", broken)
    model = load("m")
    assert not model.ready and not model.versions
    assert model.reason == "KeyError: 'oops'"


def test_unparsable_config(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", "max_batch_sise: 3\n")
    model = load("m")
    assert not model.ready
    assert model.reason.startswith("failed to parse config.pbtxt of model 'm'")


def test_no_version_folder(tmp_path: Path, load: Callable[..., Model]) -> None:
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=""))
    model = load("m")
    assert not model.ready
    assert model.versions == {}
    assert model.reason == "no version folder to load for model 'm'"


def test_missing_version_folder_for_a_specific_version(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m", 1)
    extra = "version_policy { specific { versions: [ 1, 3 ] } }"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    model = load("m")
    assert model.versions[1].state is State.READY
    assert model.versions[3].state is State.UNAVAILABLE
    assert model.versions[3].scheduler is None
    assert model.versions[3].reason == "model file 3/model.onnx not found"
    assert model.ready_versions() == [1]
    assert not model.ready


def test_missing_model_file_in_the_latest_version_folder(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    """A complete config needs no model file to be read before the versions load: version 2's
    missing file makes version 2 UNAVAILABLE, and version 1 still loads."""
    _identity(tmp_path, "m", 1)
    (tmp_path / "m" / "2").mkdir()  # folder without model.onnx
    extra = "version_policy { specific { versions: [ 1, 2 ] } }"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    model = load("m")
    assert model.reason == ""
    assert model.versions[1].state is State.READY
    assert model.versions[2].state is State.UNAVAILABLE
    assert model.versions[2].reason == "model file 2/model.onnx not found"


def test_missing_model_file_for_auto_complete(tmp_path: Path, load: Callable[..., Model]) -> None:
    """A partial config is completed from the newest version's file: without it, the load
    says so (it used to be ONNX Runtime's message, with the host path in it)."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    _write_config(tmp_path, "m", 'backend: "onnxruntime"\nmax_batch_size: 4\n')
    assert load("m").reason == (
        "unable to complete the config of model 'm': model file 1/model.onnx not found"
    )


def test_kind_gpu_group_with_a_gpu_is_unavailable_with_reason(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    text = IDENTITY_CONFIG.format(name="m", input="INPUT0", extra="").replace(
        "KIND_CPU", "KIND_GPU"
    )
    _write_config(tmp_path, "m", text)
    model = load("m", gpu_count=1)
    version = model.versions[1]
    assert version.state is State.UNAVAILABLE
    assert version.scheduler is None
    assert "KIND_GPU" in version.reason
    assert "CUDA" in version.reason
    assert not model.ready


def test_kind_gpu_group_without_gpus_is_refused(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    text = IDENTITY_CONFIG.format(name="m", input="INPUT0", extra="").replace(
        "KIND_CPU", "KIND_GPU"
    )
    _write_config(tmp_path, "m", text)
    model = load("m", gpu_count=0)
    assert not model.ready
    assert (
        model.reason == "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"
    )


def test_config_input_not_in_the_onnx_file(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="WRONG", extra=""))
    model = load("m")
    version = model.versions[1]
    assert version.state is State.UNAVAILABLE
    assert version.reason == (
        "unable to load model 'm': configuration expects input 'WRONG' but the model has ['INPUT0']"
    )
    assert not model.ready


def test_config_datatype_differs_from_the_onnx_file(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m", dtype="INT32")
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=""))
    model = load("m")
    assert model.versions[1].state is State.UNAVAILABLE
    assert model.versions[1].reason == (
        "unable to load model 'm': input 'INPUT0' has datatype TYPE_INT32 in the model but "
        "TYPE_FP32 in the configuration"
    )


def test_corrupt_model_file(tmp_path: Path, load: Callable[..., Model]) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=""))
    model = load("m")
    assert model.versions[1].state is State.UNAVAILABLE
    assert model.versions[1].reason.startswith("unable to load model 'm': ")


def test_corrupt_model_file_without_config(tmp_path: Path, load: Callable[..., Model]) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    model = load("m")
    assert not model.ready
    assert model.reason.startswith("unable to load model 'm': ")


def test_auto_complete_disabled_needs_a_full_config(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    model = load("m", Settings(disable_auto_complete_config=True))
    assert not model.ready
    assert model.reason == "model 'm' must specify at least one input"


def test_autofill_refuses_max_batch_for_unbatchable_model(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m", dims=[4])
    _write_config(tmp_path, "m", "max_batch_size: 4\n")
    model = load("m")
    assert model.reason == (
        "autofill failed for model 'm': model does not support batching while non-zero "
        "max_batch_size is specified"
    )


def test_corrupt_model_file_reason_shows_no_host_path(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    test_corrupt_model_file(tmp_path, load)
    reason = load("m").versions[1].reason
    assert "INVALID_PROTOBUF" in reason and "m/1/model.onnx" in reason, reason
    assert str(tmp_path) not in reason


# ---- files a config names stay in their folders (hostile configs) ---------------------------


@pytest.mark.parametrize(
    "filename", ["../../other/1/model.onnx", "../2/model.onnx", "{abs}", "link.onnx"]
)
def test_model_files_outside_the_version_folder_are_refused(
    tmp_path: Path, load: Callable[..., Model], filename: str
) -> None:
    _identity(tmp_path, "other")  # a model file outside m's version folder
    _identity(tmp_path, "m", version=2)
    (tmp_path / "m" / "1").mkdir()
    (tmp_path / "m" / "1" / "link.onnx").symlink_to(tmp_path / "other" / "1" / "model.onnx")
    filename = filename.format(abs=tmp_path / "other" / "1" / "model.onnx")
    _write_config(
        tmp_path, "m",
        IDENTITY_CONFIG.format(
            name="m", input="INPUT0",
            extra=f'default_model_filename: "{filename}"\nversion_policy {{ specific {{ versions: 1 }} }}',
        ),
    )
    model = load("m")
    assert not model.ready
    reason = model.versions[1].reason if model.versions else model.reason
    assert reason.startswith("unable to load model 'm': model file "), reason
    assert "the model's version folder" in reason
    assert str(tmp_path) not in reason


def test_a_model_file_that_is_a_fifo_is_refused_without_blocking(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    os.mkfifo(tmp_path / "m" / "1" / "model.onnx")  # opening it would wait for a writer
    model = load("m")  # no config: auto-complete would read it first
    assert model.reason == "unable to load model 'm': model file '1/model.onnx' is not a regular file"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=""))
    model = load("m")
    assert model.versions[1].reason == (
        "unable to load model 'm': model file '1/model.onnx' is not a regular file"
    )


def test_a_config_pbtxt_that_is_a_fifo_is_refused(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    os.mkfifo(tmp_path / "m" / "config.pbtxt")
    assert load("m").reason == (
        "unable to load model 'm': the config 'config.pbtxt' is not a regular file"
    )


def test_label_files_must_be_inside_the_model_folder(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    (tmp_path / "labels.txt").write_text("secret\n")
    base = IDENTITY_CONFIG.replace(
        'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}',
        'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "{label}" }}',
    )
    assert "label_filename" in base
    for label, reason in (
        ("../labels.txt", "label file of output 'OUTPUT0' '../labels.txt' resolves outside"),
        (str(tmp_path / "labels.txt"), "must be a relative path inside the model's folder, not"),
        ("missing.txt", "label file 'missing.txt' of output 'OUTPUT0' not found"),
    ):
        _write_config(tmp_path, "m", base.format(name="m", input="INPUT0", extra="", label=label))
        model = load("m")
        assert not model.ready and reason in model.reason, model.reason
    (tmp_path / "m" / "labels.txt").write_text("cat\ndog\n")
    _write_config(tmp_path, "m", base.format(name="m", input="INPUT0", extra="", label="labels.txt"))
    assert load("m").ready


def test_a_loaded_version_holds_its_outputs_labels(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    config = IDENTITY_CONFIG.replace(
        'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}',
        'output {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "l.txt" }}',
    )
    (tmp_path / "m" / "l.txt").write_text("cat\ndog\n")
    _write_config(tmp_path, "m", config.format(name="m", input="INPUT0", extra=""))
    spec = load("m").versions[1].spec
    assert spec is not None
    assert spec.outputs["OUTPUT0"].labels == (b"cat", b"dog")


def test_external_data_outside_the_version_folder_is_refused(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    """ONNX Runtime (>= 1.24) checks where external data points; the reason keeps host paths
    out."""
    (tmp_path / "secret.bin").write_bytes(np.ones(4, np.float32).tobytes())
    locations = ("../../secret.bin", str(tmp_path / "secret.bin"), "link.bin", "data.bin")
    for index, location in enumerate(locations):
        name = f"ext{index}"
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        (folder / "link.bin").symlink_to(tmp_path / "secret.bin")
        (folder / "data.bin").write_bytes(np.ones(4, np.float32).tobytes())
        make_models.save(_add_external_weights(location), folder / "model.onnx")
        model = load(name)
        if location == "data.bin":
            assert model.ready, model.reason
            continue
        assert not model.ready
        reason = model.versions[1].reason if model.versions else model.reason
        assert "External data path" in reason, reason
        assert str(tmp_path) not in reason


def _add_external_weights(location: str) -> onnx.ModelProto:
    """FP32 [4] INPUT0 + W -> OUTPUT0, W's 16 bytes in the external file ``location``."""
    weights = numpy_helper.from_array(np.ones(4, np.float32), "W")
    weights.ClearField("raw_data")
    weights.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("length", "16")):
        entry = weights.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "W"], ["OUTPUT0"])],
        "external",
        [helper.make_tensor_value_info("INPUT0", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.FLOAT, [4])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    return model


# ---- configs past the bounds, and features not implemented yet -----------------------------


def test_configs_past_the_bounds_are_refused_before_loading(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    for extra, field in (
        ("instance_group { count: 100000 }", "'instance_group[1].count' is 100000"),
        ("dynamic_batching { priority_levels: 1000000000 }", "'dynamic_batching.priority_levels'"),
    ):
        _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
        started = time.monotonic()
        model = load("m")
        assert time.monotonic() - started < 5
        assert not model.ready and field in model.reason, model.reason


@pytest.mark.parametrize(
    "extra, field",
    [
        ('model_repository_agents { agents { name: "checksum" } }', "model_repository_agents"),
        ('model_operations { op_library_filename: "libop.so" }', "model_operations"),
        ('cc_model_filenames { key: "8.0" value: "a100.onnx" }', "cc_model_filenames"),
        ("instance_group { count: 1 passive: true }", "instance_group { passive: true }"),
    ],
)
def test_features_not_implemented_yet_are_refused(
    tmp_path: Path, load: Callable[..., Model], extra: str, field: str
) -> None:
    _identity(tmp_path, "m")
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    model = load("m")
    assert not model.ready
    assert model.reason == (
        f"model 'm': {field} in its configuration is not supported by this server yet; remove "
        "it to serve the model without it"
    )


def test_ensemble_scheduling_on_another_platform_is_refused(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    extra = 'ensemble_scheduling { step { model_name: "x" } }'
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    model = load("m")
    assert not model.ready
    assert model.reason.startswith(
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"
    ), model.reason


def test_harmless_forms_of_those_features_load(tmp_path: Path, load: Callable[..., Model]) -> None:
    _identity(tmp_path, "m")
    extra = "response_cache { enable: false }\nmodel_transaction_policy { decoupled: false }"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    assert load("m").ready


def test_decoupled_models_are_refused_by_backends_that_cannot_serve_them(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "m")
    extra = "model_transaction_policy { decoupled: true }"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    assert load("m").reason == (
        "model 'm': model_transaction_policy { decoupled: true } is not supported by the "
        "onnxruntime backend yet"
    )


def test_model_config_name_chooses_the_config_loaded(
    tmp_path: Path, load: Callable[..., Model]
) -> None:
    _identity(tmp_path, "ident", dims=["batch", 4])
    _write_config(tmp_path, "ident", "max_batch_size: 8\n")
    (tmp_path / "ident" / "configs").mkdir()
    (tmp_path / "ident" / "configs" / "small.pbtxt").write_text("max_batch_size: 2\n")
    chosen = load("ident", Settings(model_config_name="small"))
    assert chosen.ready and chosen.config is not None and chosen.config.max_batch_size == 2
    fallback = load("ident", Settings(model_config_name="large"))
    assert fallback.ready and fallback.config is not None and fallback.config.max_batch_size == 8


@pytest.mark.parametrize(
    "settings, warned",
    [
        (Settings(), "but no cache is configured (--cache-config local,size=BYTES)"),
        (Settings(response_cache_byte_size=1 << 20), None),
    ],
)
def test_a_model_enabling_the_response_cache_loads_and_is_told_when_it_is_off(
    tmp_path: Path,
    load: Callable[..., Model],
    caplog: pytest.LogCaptureFixture,
    settings: Settings,
    warned: str | None,
) -> None:
    _identity(tmp_path, "m")
    extra = "response_cache { enable: true }"
    _write_config(tmp_path, "m", IDENTITY_CONFIG.format(name="m", input="INPUT0", extra=extra))
    with caplog.at_level(logging.WARNING):
        model = load("m", settings)
    assert model.ready, model.reason
    cache_lines = [r.getMessage() for r in caplog.records if "response cache" in r.getMessage()]
    if warned is None:
        assert cache_lines == []
    else:
        assert len(cache_lines) == 1 and warned in cache_lines[0], cache_lines
