"""Unit tests for server.repository.limits: every count a config carries is bounded, and the
refusal names the field."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository.limits import (
    MAX_DIMS,
    MAX_ENTRIES,
    MAX_INSTANCES,
    MAX_PRIORITY_LEVELS,
    check_limits,
)


def _config(**fields: object) -> mc.ModelConfig:
    return json_format.ParseDict({"name": "m", **fields}, mc.ModelConfig())


def _refused(config: mc.ModelConfig) -> str:
    with pytest.raises(ModelLoadError) as caught:
        check_limits(config)
    return caught.value.message


def test_a_usual_config_passes() -> None:
    check_limits(
        _config(
            max_batch_size=8,
            input=[{"name": f"I{i}", "data_type": "TYPE_FP32", "dims": [-1] * 8} for i in range(64)],
            output=[{"name": "O", "data_type": "TYPE_FP32", "dims": [4]}],
            instance_group=[{"count": 4, "kind": "KIND_GPU", "gpus": [0, 1, 2, 3]}],
            dynamic_batching={"preferred_batch_size": [2, 4, 8], "priority_levels": 3},
            parameters={"intra_op_thread_count": {"string_value": "1"}},
        )
    )


@pytest.mark.parametrize(
    "fields, field, limit",
    [
        ({"input": [{"name": str(i)} for i in range(MAX_ENTRIES + 1)]}, "'input'", MAX_ENTRIES),
        ({"output": [{"name": str(i)} for i in range(MAX_ENTRIES + 1)]}, "'output'", MAX_ENTRIES),
        (
            {"input": [{"name": "x", "dims": [1] * (MAX_DIMS + 1)}]},
            "'input[0].dims'",
            MAX_DIMS,
        ),
        (
            {"output": [{"name": "y", "reshape": {"shape": [1] * (MAX_DIMS + 1)}}]},
            "'output[0].reshape.shape'",
            MAX_DIMS,
        ),
        (
            {"dynamic_batching": {"preferred_batch_size": list(range(1, MAX_ENTRIES + 2))}},
            "'dynamic_batching.preferred_batch_size'",
            MAX_ENTRIES,
        ),
        (
            {"parameters": {str(i): {"string_value": ""} for i in range(MAX_ENTRIES + 1)}},
            "'parameters'",
            MAX_ENTRIES,
        ),
        (
            {"version_policy": {"specific": {"versions": list(range(1, MAX_ENTRIES + 2))}}},
            "'version_policy.specific.versions'",
            MAX_ENTRIES,
        ),
        (
            {"instance_group": [{"gpus": list(range(MAX_ENTRIES + 1))}]},
            "'instance_group[0].gpus'",
            MAX_ENTRIES,
        ),
        (
            {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
                {"name": "cuda", "parameters": {str(i): "1" for i in range(MAX_ENTRIES + 1)}}
            ]}}},
            "'optimization.execution_accelerators.gpu_execution_accelerator[0].parameters'",
            MAX_ENTRIES,
        ),
    ],
)
def test_long_lists_are_refused_naming_the_field(
    fields: dict[str, object], field: str, limit: int
) -> None:
    message = _refused(_config(**fields))
    assert field in message and f"more than the {limit} allowed" in message, message


def test_instances_are_bounded_per_group_and_in_all() -> None:
    message = _refused(_config(instance_group=[{"count": 100_000}]))
    assert message == (
        f"model 'm': 'instance_group[0].count' is 100000, more than the {MAX_INSTANCES} allowed"
    )
    message = _refused(_config(instance_group=[{"count": 64, "gpus": [0, 1, 2, 3, 4]}]))
    assert "asks for 320 instances" in message
    message = _refused(_config(instance_group=[{"count": 200}, {"count": 100}]))
    assert "asks for 300 instances" in message
    check_limits(_config(instance_group=[{"count": MAX_INSTANCES}]))


def test_priority_levels_are_bounded() -> None:
    message = _refused(_config(dynamic_batching={"priority_levels": 10**9}))
    assert message == (
        "model 'm': 'dynamic_batching.priority_levels' is 1000000000, more than the "
        f"{MAX_PRIORITY_LEVELS} allowed"
    )
    check_limits(_config(dynamic_batching={"priority_levels": MAX_PRIORITY_LEVELS}))
