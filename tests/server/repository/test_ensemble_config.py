"""Ensemble config checks, each with Triton's message: the graph alone
(``validate_structure``) and against the composing models' configs (``link``)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository.ensemble_config import link, validate_structure

HEAD = """name: "ens" platform: "ensemble" max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
OUT = 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'


def _step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def _config(*steps: str, head: str = HEAD, out: str = OUT) -> mc.ModelConfig:
    text = head + out + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }"
    return text_format.Parse(text, mc.ModelConfig())


def _model(name: str, max_batch: int = 4, dtype: str = "TYPE_FP32", dims: str = "4") -> mc.ModelConfig:
    text = (
        f'name: "{name}" max_batch_size: {max_batch}\n'
        f'input [ {{ name: "X" data_type: {dtype} dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "Y" data_type: {dtype} dims: [ {dims} ] }} ]'
    )
    return text_format.Parse(text, mc.ModelConfig())


def _lookup(*models: mc.ModelConfig):  # type: ignore[no-untyped-def]
    found = {m.name: m for m in models}
    return lambda name, version: found[name]


def _structure_error(config: mc.ModelConfig) -> str:
    with pytest.raises(ModelLoadError) as caught:
        validate_structure(config)
    return caught.value.message


def test_a_chain_is_valid_and_becomes_a_plan() -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "mid"}), _step("b", {"X": "mid"}, {"Y": "OUT"}))
    validate_structure(config)
    plan = link(config, _lookup(_model("a"), _model("b")))
    assert [s.model_name for s in plan.steps] == ["a", "b"]
    assert plan.steps[0].model_version == ""
    assert [s.model_name for s in plan.needed_steps(["OUT"])] == ["a", "b"]


@pytest.mark.parametrize(
    ("steps", "out", "message"),
    [
        # an ensemble output no step produces
        ([_step("a", {"X": "IN"}, {"Y": "mid"})], 'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]',
         "ensemble output 'OUT' for ensemble ens' is not used"),
        # a step input fed by nothing: its output is never written
        ([_step("a", {"X": "nothing"}, {"Y": "OUT"}), _step("b", {"X": "IN"}, {"Y": "z"})], OUT,
         "output 'OUT' for ensemble 'ens' is not written"),
        # a cycle: a and b feed each other
        ([_step("a", {"X": "IN", "W": "q"}, {"Y": "p"}), _step("b", {"X": "p"}, {"Y": "q"}),
          _step("c", {"X": "p"}, {"Y": "OUT"})], OUT,
         "output 'OUT' for ensemble 'ens' is not written"),
        # the same tensor produced twice
        ([_step("a", {"X": "IN"}, {"Y": "OUT"}), _step("b", {"X": "IN"}, {"Y": "OUT"})], OUT,
         "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'ens' step 1"),
        # a tensor nobody reads
        ([_step("a", {"X": "IN"}, {"Y": "OUT", "Z": "spare"})], OUT,
         "ensemble tensor 'spare' is unused in ensemble 'ens'"),
        ([], OUT, "must specify 'step' for ensemble 'ens'"),
    ],
)
def test_graph_errors(steps: list[str], out: str, message: str) -> None:
    assert _structure_error(_config(*steps, out=out)) == message


def test_unused_input() -> None:
    head = HEAD.replace("] }", '] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] }', 1)
    config = _config(_step("a", {"X": "IN"}, {"Y": "OUT"}), head=head)
    assert _structure_error(config) == "ensemble input 'EXTRA' for ensemble ens' is not used"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('instance_group [ { count: 1 } ]', "instance group should not be specified for ensemble 'ens'"),
        ("optimization { priority: PRIORITY_MAX }", "optimization should not be specified for ensemble 'ens'"),
        ('model_warmup [ { name: "w" } ]', "model_warmup can not be specified for ensemble 'ens'"),
    ],
)
def test_fields_an_ensemble_refuses(extra: str, message: str) -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "OUT"}))
    text_format.Merge(extra, config)
    assert _structure_error(config) == message


def test_ensemble_scheduling_needs_the_ensemble_platform() -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "OUT"}))
    config.platform = "onnxruntime_onnx"
    assert _structure_error(config) == (
        "ensemble scheduling cannot be set for model 'ens' whose platform is not ensemble"
    )


def _link_error(config: mc.ModelConfig, *models: mc.ModelConfig) -> str:
    validate_structure(config)
    with pytest.raises(ModelLoadError) as caught:
        link(config, _lookup(*models))
    return caught.value.message


def test_datatype_mismatch_between_producer_and_consumer() -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "mid"}), _step("b", {"X": "mid"}, {"Y": "OUT"}))
    assert _link_error(config, _model("a", dtype="TYPE_INT32"), _model("b")) == (
        "inconsistent data type: TYPE_FP32 is inferred from model ens while TYPE_INT32 is "
        "inferred from model a"
    )


def test_shape_mismatch_between_producer_and_consumer() -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "mid"}), _step("b", {"X": "mid"}, {"Y": "OUT"}))
    a = _model("a")
    a.output[0].dims[:] = [8]
    assert _link_error(config, a, _model("b")) == (
        "inconsistent shape: [-1,8] is inferred from model a while [-1,4] is inferred from "
        "model b"
    )


def test_mapping_errors() -> None:
    config = _config(_step("a", {"NOPE": "IN"}, {"Y": "OUT"}))
    assert _link_error(config, _model("a")) == (
        "in ensemble ens, ensemble tensor IN is mapping to non-existing input NOPE in model a"
    )
    config = _config(_step("a", {"X": "IN"}, {"NOPE": "OUT"}))
    assert _link_error(config, _model("a")) == (
        "in ensemble ens, ensemble tensor OUT is mapped from non-existing output NOPE in model a"
    )
    two = _model("a")
    two.input.add(name="X2", data_type=mc.TYPE_FP32, dims=[4])
    config = _config(_step("a", {"X": "IN"}, {"Y": "OUT"}))
    assert _link_error(config, two) == (
        "in ensemble ens, input X2 in model a is not mapped to any ensemble tensors"
    )


def test_composing_model_with_a_smaller_batch() -> None:
    config = _config(_step("a", {"X": "IN"}, {"Y": "OUT"}))
    assert _link_error(config, _model("a", max_batch=2)) == (
        "ensemble ens allows maximum batch size 4, but it contains model a which only allows "
        "maximum batch size to be 2"
    )
