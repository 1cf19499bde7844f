"""Unit tests for server.repository.config: parse, JSON form, Triton's defaults and checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository import config as model_config
from server.repository.config import normalize, read_config, to_json, validate
from tests.server.http.helpers import assert_simple_ok
from tests.server_process import EXAMPLES, start_server


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


# ---- read_config ---------------------------------------------------------------------------


def test_missing_file_gives_empty_config(tmp_path: Path) -> None:
    config = read_config(tmp_path)
    assert config == mc.ModelConfig()
    assert config.ByteSize() == 0


def test_config_pbtxt_is_parsed(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text(
        'name: "simple"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
    )
    config = read_config(tmp_path)
    assert config.name == "simple"
    assert config.max_batch_size == 8
    assert config.input[0].data_type == mc.TYPE_INT32
    assert list(config.input[0].dims) == [16]
    assert config.dynamic_batching.max_queue_delay_microseconds == 100


def test_unknown_field_is_a_load_error(tmp_path: Path) -> None:
    model_dir = tmp_path / "mymodel"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text('name: "mymodel"\nmax_batch_sise: 8\n')
    with pytest.raises(ModelLoadError) as err:
        read_config(model_dir)
    message = str(err.value)
    assert message.startswith("failed to parse config.pbtxt of model 'mymodel': ")
    assert "max_batch_sise" in message


def test_syntax_error_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("name: \n{{")
    with pytest.raises(ModelLoadError, match="failed to parse config.pbtxt"):
        read_config(tmp_path)


def test_bad_enum_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('input { name: "X" data_type: TYPE_FLOAT }\n')
    with pytest.raises(ModelLoadError, match="TYPE_FLOAT"):
        read_config(tmp_path)


def test_non_utf8_file_is_a_load_error(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_bytes(b'name: "\xff\xfe"\n')
    with pytest.raises(ModelLoadError, match="failed to parse config.pbtxt"):
        read_config(tmp_path)


def _custom(model_dir: Path, name: str, text: str) -> None:
    (model_dir / "configs").mkdir(parents=True, exist_ok=True)
    (model_dir / "configs" / f"{name}.pbtxt").write_text(text)


def test_model_config_name_picks_the_custom_file(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("max_batch_size: 8\n")
    _custom(tmp_path, "h100", "max_batch_size: 32\n")
    assert model_config.config_file(tmp_path) == "config.pbtxt"
    assert model_config.config_file(tmp_path, "h100") == "configs/h100.pbtxt"
    assert read_config(tmp_path, "h100").max_batch_size == 32
    assert read_config(tmp_path).max_batch_size == 8


def test_without_the_custom_file_the_default_one_is_read(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text("max_batch_size: 8\n")
    _custom(tmp_path, "a100", "max_batch_size: 16\n")
    assert model_config.config_file(tmp_path, "h100") == "config.pbtxt"
    assert read_config(tmp_path, "h100").max_batch_size == 8
    (tmp_path / "config.pbtxt").unlink()
    assert read_config(tmp_path, "h100") == mc.ModelConfig()  # auto-complete fills it


def test_a_custom_file_is_used_without_a_default_one(tmp_path: Path) -> None:
    _custom(tmp_path, "h100", "max_batch_size: 32\n")
    assert read_config(tmp_path, "h100").max_batch_size == 32


def test_errors_name_the_custom_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "mymodel"
    _custom(model_dir, "h100", "max_batch_sise: 8\n")
    with pytest.raises(ModelLoadError) as err:
        read_config(model_dir, "h100")
    assert str(err.value).startswith("failed to parse configs/h100.pbtxt of model 'mymodel': ")
    (model_dir / "configs" / "h100.pbtxt").unlink()
    (model_dir / "configs" / "h100.pbtxt").mkdir()
    with pytest.raises(ModelLoadError, match="'configs/h100.pbtxt' is not a regular file"):
        read_config(model_dir, "h100")


def test_load_error_is_http_400() -> None:
    assert ModelLoadError("x").http_status == 400


def test_parse_json_config_round_trip() -> None:
    config = _config(
        'name: "m" max_batch_size: 4 input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }'
    )
    back = model_config.parse_json_config(json.dumps(to_json(config)))
    assert back == config


def test_parse_json_config_error() -> None:
    with pytest.raises(ModelLoadError, match="failed to parse JSON model config"):
        model_config.parse_json_config('{"nope": 1}')


# ---- to_json ------------------------------------------------------------------------------

FULL = """
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 4
version_policy { specific { versions: [ 1, 3 ] } }
input {
  name: "I" data_type: TYPE_FP32 dims: [ -1, 3 ]
  reshape { shape: [ 3, -1 ] }
}
output { name: "O" data_type: TYPE_INT64 dims: [ 2 ] }
dynamic_batching {
  preferred_batch_size: [ 2, 4 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { default_timeout_microseconds: 5 timeout_action: DELAY }
  priority_queue_policy { key: 1 value { default_timeout_microseconds: 7 max_queue_size: 3 } }
}
instance_group {
  kind: KIND_CPU count: 1
  secondary_devices { kind: KIND_NVDLA device_id: 3 }
}
optimization { cuda { graph_spec { input { key: "I" value { dim: [ 4 ] } } } } }
parameters { key: "k" value { string_value: "v" } }
"""


def test_to_json_int64_fields_are_numbers() -> None:
    data = to_json(_config(FULL))
    assert data["input"][0]["dims"] == [-1, 3]
    assert data["input"][0]["reshape"] == {"shape": [3, -1]}
    assert data["output"][0]["dims"] == [2]
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2
    assert batching["default_priority_level"] == 1
    assert batching["preferred_batch_size"] == [2, 4]
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5
    # map keys stay strings; the int64 inside is a number
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 7
    assert batching["priority_queue_policy"]["1"]["max_queue_size"] == 3


def test_to_json_fields_triton_leaves_as_strings() -> None:
    data = to_json(_config(FULL))
    assert data["instance_group"][0]["secondary_devices"][0]["device_id"] == "3"
    assert data["optimization"]["cuda"]["graph_spec"][0]["input"]["I"]["dim"] == ["4"]


def test_to_json_enums_as_names() -> None:
    data = to_json(_config(FULL))
    assert data["input"][0]["data_type"] == "TYPE_FP32"
    assert data["input"][0]["format"] == "FORMAT_NONE"
    assert data["output"][0]["data_type"] == "TYPE_INT64"
    assert data["instance_group"][0]["kind"] == "KIND_CPU"
    assert data["instance_group"][0]["secondary_devices"][0]["kind"] == "KIND_NVDLA"
    assert data["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
    assert data["dynamic_batching"]["priority_queue_policy"]["1"]["timeout_action"] == "REJECT"
    assert data["optimization"]["priority"] == "PRIORITY_DEFAULT"


def test_to_json_prints_every_primitive() -> None:
    data = to_json(
        _config(
            'name: "m" input { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } '
            'output { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } '
            "dynamic_batching { }"
        )
    )
    for key, value in {
        "platform": "",
        "backend": "",
        "runtime": "",
        "max_batch_size": 0,
        "batch_input": [],
        "batch_output": [],
        "instance_group": [],
        "default_model_filename": "",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
    }.items():
        assert data[key] == value, key
    assert data["input"][0] == {
        "name": "X",
        "data_type": "TYPE_FP32",
        "format": "FORMAT_NONE",
        "dims": [1],
        "is_shape_tensor": False,
        "allow_ragged_batch": False,
        "optional": False,
        "is_non_linear_format_io": False,
    }
    assert data["output"][0] == {
        "name": "Y",
        "data_type": "TYPE_FP32",
        "dims": [1],
        "label_filename": "",
        "is_shape_tensor": False,
        "is_non_linear_format_io": False,
    }
    assert data["dynamic_batching"] == {
        "preferred_batch_size": [],
        "max_queue_delay_microseconds": 0,
        "preserve_ordering": False,
        "priority_levels": 0,
        "default_priority_level": 0,
        "priority_queue_policy": {},
    }


def test_to_json_omits_unset_submessages() -> None:
    data = to_json(_config('name: "m"'))
    for key in (
        "version_policy",
        "dynamic_batching",
        "sequence_batching",
        "ensemble_scheduling",
        "optimization",
        "model_transaction_policy",
        "response_cache",
        "model_repository_agents",
    ):
        assert key not in data, key


def test_to_json_set_empty_submessage_is_printed_complete() -> None:
    data = to_json(_config("model_transaction_policy { }"))
    assert data["model_transaction_policy"] == {"decoupled": False}


def test_to_json_parameters_map() -> None:
    assert to_json(_config(FULL))["parameters"] == {"k": {"string_value": "v"}}


def test_to_json_uses_proto_field_names() -> None:
    data = to_json(_config(FULL))
    assert "max_batch_size" in data and "maxBatchSize" not in data


def test_to_json_is_json_serialisable_and_matches_triton_example() -> None:
    config = _config(
        'name: "model_test" max_batch_size: 4 '
        'input { name: "images" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } '
        'output { name: "output" data_type: TYPE_FP32 dims: [ 10 ] } '
        "dynamic_batching { }"
    )
    config.backend = "onnxruntime"
    config.platform = "onnxruntime_onnx"
    config.default_model_filename = "model.onnx"
    normalize(config, gpu_count=0)
    data = json.loads(json.dumps(to_json(config)))
    assert data["version_policy"] == {"latest": {"num_versions": 1}}
    assert data["dynamic_batching"]["preferred_batch_size"] == [4]
    assert data["optimization"]["input_pinned_memory"] == {"enable": True}
    assert data["optimization"]["output_pinned_memory"] == {"enable": True}
    assert data["instance_group"] == [
        {
            "name": "model_test",
            "kind": "KIND_CPU",
            "count": 2,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]
    assert data["input"][0]["dims"] == [3, -1, -1]


# ---- normalize ------------------------------------------------------------------------------


def test_normalize_version_policy_latest_one() -> None:
    config = _config('name: "m"')
    normalize(config, 0)
    assert config.version_policy.WhichOneof("policy_choice") == "latest"
    assert config.version_policy.latest.num_versions == 1


def test_normalize_keeps_given_version_policy() -> None:
    config = _config('name: "m" version_policy { all { } }')
    normalize(config, 0)
    assert config.version_policy.WhichOneof("policy_choice") == "all"


def test_normalize_preferred_batch_size_defaults_to_max_batch_size() -> None:
    config = _config('name: "m" max_batch_size: 16 dynamic_batching { }')
    normalize(config, 0)
    assert list(config.dynamic_batching.preferred_batch_size) == [16]


def test_normalize_keeps_given_preferred_batch_sizes() -> None:
    config = _config(
        'name: "m" max_batch_size: 16 dynamic_batching { preferred_batch_size: [ 4, 8 ] }'
    )
    normalize(config, 0)
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]


def test_normalize_without_dynamic_batching_adds_none() -> None:
    config = _config('name: "m" max_batch_size: 16')
    normalize(config, 0)
    assert not config.HasField("dynamic_batching")


def test_normalize_pinned_memory() -> None:
    config = _config('name: "m"')
    normalize(config, 0)
    assert config.optimization.input_pinned_memory.enable is True
    assert config.optimization.output_pinned_memory.enable is True


def test_normalize_keeps_disabled_pinned_memory() -> None:
    config = _config('name: "m" optimization { input_pinned_memory { enable: false } }')
    normalize(config, 0)
    assert config.optimization.input_pinned_memory.enable is False
    assert config.optimization.output_pinned_memory.enable is True


def test_normalize_default_instance_group_cpu() -> None:
    config = _config('name: "mymodel"')
    normalize(config, 0)
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    assert group.name == "mymodel"
    assert group.kind == mc.ModelInstanceGroup.KIND_CPU
    assert group.count == 2
    assert list(group.gpus) == []


def test_normalize_default_instance_group_with_gpus() -> None:
    config = _config('name: "m"')
    normalize(config, 2)
    group = config.instance_group[0]
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU
    assert list(group.gpus) == [0, 1]
    assert group.count == 1


def test_normalize_unnamed_groups_get_model_index_names() -> None:
    config = _config(
        'name: "m" instance_group { kind: KIND_CPU count: 3 } '
        'instance_group { name: "mine" kind: KIND_CPU } instance_group { kind: KIND_CPU }'
    )
    normalize(config, 0)
    assert [g.name for g in config.instance_group] == ["m_0", "mine", "m_2"]
    assert [g.count for g in config.instance_group] == [3, 2, 2]


def test_normalize_kind_gpu_without_gpus_lists_all() -> None:
    config = _config('name: "m" instance_group { kind: KIND_GPU count: 2 }')
    normalize(config, 3)
    assert list(config.instance_group[0].gpus) == [0, 1, 2]
    assert config.instance_group[0].count == 2


def test_normalize_kind_gpu_keeps_given_gpus() -> None:
    config = _config('name: "m" instance_group { kind: KIND_GPU gpus: [ 1 ] }')
    normalize(config, 3)
    assert list(config.instance_group[0].gpus) == [1]
    assert config.instance_group[0].count == 1


# ---- validate -------------------------------------------------------------------------------

VALID = """
name: "m"
max_batch_size: 8
input { name: "I" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "O" data_type: TYPE_FP32 dims: [ 4 ] }
"""


def _normalized(extra: str = "") -> mc.ModelConfig:
    config = _config(VALID + extra)
    normalize(config, 0)
    return config


def _load_error(config: mc.ModelConfig) -> str:
    with pytest.raises(ModelLoadError) as err:
        validate(config)
    return str(err.value)


def test_valid_config_passes() -> None:
    validate(_normalized("dynamic_batching { preferred_batch_size: [ 2, 8 ] }"))


def test_negative_max_batch_size() -> None:
    config = _normalized()
    config.max_batch_size = -1
    assert _load_error(config) == "'max_batch_size' must be non-negative value"


@pytest.mark.parametrize("size", [0, -2])
def test_preferred_size_must_be_positive(size: int) -> None:
    config = _normalized(f"dynamic_batching {{ preferred_batch_size: [ {size} ] }}")
    assert _load_error(config) == "dynamic batching preferred size must be positive"


def test_preferred_size_must_not_exceed_max_batch_size() -> None:
    config = _normalized("dynamic_batching { preferred_batch_size: [ 4, 16 ] }")
    assert _load_error(config) == "dynamic batching preferred size must be <= max batch size for m"


def test_default_priority_level_in_range() -> None:
    config = _normalized("dynamic_batching { priority_levels: 2 default_priority_level: 3 }")
    assert _load_error(config) == "default priority level must be in range [1, 2]"


def test_priority_queue_policy_level_in_range() -> None:
    config = _normalized(
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 5 value { max_queue_size: 1 } } }"
    )
    assert _load_error(config) == "priority queue policy must have priority level in range [1, 2]"


def test_preserve_ordering_allows_one_priority_level() -> None:
    config = _normalized(
        "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }"
    )
    assert (
        _load_error(config) == "Only one priority level is allowed when 'preserve_ordering' is true"
    )


def test_preserve_ordering_with_delay_timeout_refused() -> None:
    config = _normalized(
        "dynamic_batching { preserve_ordering: true "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 } }"
    )
    with pytest.raises(ModelLoadError):
        validate(config)


def test_no_inputs() -> None:
    config = _config('name: "m" output { name: "O" data_type: TYPE_FP32 dims: [ 1 ] }')
    normalize(config, 0)
    assert _load_error(config) == "model 'm' must specify at least one input"


def test_no_outputs() -> None:
    config = _config('name: "m" input { name: "I" data_type: TYPE_FP32 dims: [ 1 ] }')
    normalize(config, 0)
    assert _load_error(config) == "model 'm' must specify at least one output"


@pytest.mark.parametrize("kind", ["input", "output"])
def test_duplicate_tensor(kind: str) -> None:
    config = _normalized(
        f'{kind} {{ name: "{"I" if kind == "input" else "O"}" data_type: TYPE_FP32 dims: [ 1 ] }}'
    )
    name = "I" if kind == "input" else "O"
    assert _load_error(config) == f"model 'm' declares {kind} '{name}' twice"


@pytest.mark.parametrize("kind", ["input", "output"])
def test_unnamed_tensor(kind: str) -> None:
    config = _normalized(f"{kind} {{ data_type: TYPE_FP32 dims: [ 1 ] }}")
    article = "an"
    assert _load_error(config) == f"model 'm' has {article} {kind} without a name"


@pytest.mark.parametrize("kind", ["input", "output"])
def test_tensor_without_data_type(kind: str) -> None:
    config = _normalized(f'{kind} {{ name: "T" dims: [ 1 ] }}')
    assert _load_error(config) == f"model 'm' {kind} 'T' must specify 'data_type'"


def test_invalid_dim() -> None:
    config = _normalized('input { name: "J" data_type: TYPE_FP32 dims: [ -2 ] }')
    assert _load_error(config) == "model 'm' input 'J' has invalid dim -2"


def test_zero_dim_is_allowed() -> None:
    validate(_normalized('input { name: "J" data_type: TYPE_FP32 dims: [ 0 ] }'))


def test_kind_gpu_without_gpus_refused() -> None:
    config = _normalized('instance_group { name: "g" kind: KIND_GPU }')
    assert _load_error(config) == (
        "instance group g of model m has kind KIND_GPU but no GPUs are available"
    )


def test_unsupported_instance_kind_refused() -> None:
    config = _normalized('instance_group { name: "g" kind: KIND_MODEL }')
    assert _load_error(config) == "instance group g of model m has unsupported kind KIND_MODEL"


def test_valid_priority_settings_pass() -> None:
    validate(
        _normalized(
            "dynamic_batching { priority_levels: 3 default_priority_level: 2 "
            "priority_queue_policy { key: 3 value { max_queue_size: 1 } } }"
        )
    )


# ---- --model-config-name on a running server ------------------------------------------------


def test_server_serves_the_config_model_config_name_picks(tmp_path: Path) -> None:
    """``simple`` has ``configs/small.pbtxt``, ``identity_fp32`` has none: the first is served
    with the custom config, the second with its default one; the index lists both ready."""
    repository = tmp_path / "models"
    for name in ("simple", "identity_fp32"):
        shutil.copytree(EXAMPLES / name, repository / name)
    default = (repository / "simple" / "config.pbtxt").read_text()
    (repository / "simple" / "configs").mkdir()
    (repository / "simple" / "configs" / "small.pbtxt").write_text(
        default.replace("max_batch_size: 8", "max_batch_size: 2")
    )
    server = start_server(repository, args=("--model-config-name=small",))
    try:
        assert server.port is not None, server.log
        status, _, body = server.request("GET", "/v2/models/simple/config")
        assert status == 200 and json.loads(body)["max_batch_size"] == 2
        status, _, body = server.request("GET", "/v2/models/identity_fp32/config")
        assert status == 200 and json.loads(body)["max_batch_size"] == 4  # auto-completed
        status, _, body = server.request("POST", "/v2/repository/index", b"{}")
        assert status == 200
        assert {(m["name"], m["state"]) for m in json.loads(body)} == {
            ("simple", "READY"), ("identity_fp32", "READY"),
        }
        assert_simple_ok(server)
    finally:
        assert server.stop() == 0
