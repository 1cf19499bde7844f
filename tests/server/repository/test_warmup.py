"""Warmup at load, without a server: every sample on every instance before the version is
READY, the statistics Triton shows for it, and the loads a failing sample fails."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from scripts import make_models
from server.repository.loader import Model, ModelVersion, State
from tests.server.repository.warmup_models import (
    DECOUPLED_RECORDER,
    SIMPLE_WARMUP,
    add_recorder,
    add_simple,
    add_warmup_file,
    calls,
    warmup_of,
)


def _version(model: Model) -> ModelVersion:
    (version,) = model.versions.values()
    return version


def _counts(version: ModelVersion) -> tuple[int, int, int, dict[int, int]]:
    stats = version.stats
    batches = {size: b.compute_infer.count for size, b in stats.batch_stats.items()}
    return stats.inference_count, stats.execution_count, stats.success.count, batches


def test_statistics_count_warmup_as_triton_does(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    # Triton 2.51, batch_size 2 count 3 on one instance: 6 inferences, 3 executions, 6 successes
    add_simple(tmp_path, "warm", SIMPLE_WARMUP.format(batch_size=2, count=3))
    version = _version(load("warm"))
    assert version.state is State.READY, version.reason
    assert _counts(version) == (6, 3, 6, {2: 3})
    assert version.stats.queue.count == 6 and version.stats.fail.count == 0
    assert version.stats.last_inference_ms > 0


def test_every_instance_runs_every_sample(tmp_path: Path, load: Callable[[str], Model]) -> None:
    add_simple(tmp_path, "warm", SIMPLE_WARMUP.format(batch_size=2, count=3), instances=2)
    assert _counts(_version(load("warm"))) == (12, 6, 12, {2: 6})


def test_python_model_is_warmed_on_each_instance_before_it_is_ready(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    folder = add_recorder(tmp_path, "rec", warmup_of("w", batch_size=3, count=2), instances=2)
    model = load("rec")
    version = _version(model)
    assert version.state is State.READY, version.reason
    seen = calls(folder)  # all written while loading, before the version was READY
    assert len(seen) == 4
    instances = [call["instance"] for call in seen]
    assert len(set(instances)) == 2 and instances[0] == instances[1] != instances[2]
    for call in seen:
        assert call["requests"] == 3  # batch_size requests in one execute call
        assert call["shapes"] == [[1, 4]] * 3
        assert call["values"] == [[0, 0, 0, 0]] * 3
    assert _counts(version) == (12, 4, 12, {3: 4})


def test_a_sample_with_a_model_error_fails_the_load(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    folder = add_recorder(
        tmp_path, "rec", warmup_of("bad", "input_data_file: \"neg\"", batch_size=2), instances=2
    )
    add_warmup_file(folder, "neg", [-1] * 4)
    version = _version(load("rec"))
    assert version.state is State.UNAVAILABLE and version.scheduler is None
    assert version.reason == (
        "Invalid argument: failed to run warmup sample 'bad': negative input; negative input"
    )
    assert len(calls(folder)) == 1  # the first failure ends the load
    assert version.stats.execution_count == 0


def test_a_sample_whose_execute_raises_fails_the_load(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    folder = add_recorder(tmp_path, "rec", warmup_of("boom", "input_data_file: \"seven\""))
    add_warmup_file(folder, "seven", [7] * 4)
    version = _version(load("rec"))
    assert version.state is State.UNAVAILABLE
    assert version.reason.startswith(
        "Invalid argument: failed to run warmup sample 'boom': Failed to process the "
        "request(s) for model 'rec', message: "
    ), version.reason
    assert "seven is not welcome" in version.reason


def test_a_sample_without_the_models_inputs_fails_as_in_triton(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    folder = add_recorder(tmp_path, "rec", warmup_of("nope", key="NOPE"))
    version = _version(load("rec"))
    assert version.reason == (
        "Invalid argument: [request id: <id_unknown>] expected 1 inputs but got 0 inputs for "
        "model 'rec'. Got input(s) [], but missing required input(s) ['IN']. Please provide "
        "all required input(s)."
    )
    assert calls(folder) == []


def test_a_sample_of_the_wrong_datatype_fails(tmp_path: Path, load: Callable[[str], Model]) -> None:
    add_simple(tmp_path, "warm", SIMPLE_WARMUP.format(batch_size=1, count=1).replace(
        "TYPE_INT32 dims: [ 16 ] zero", "TYPE_FP32 dims: [ 16 ] zero"
    ))
    assert _version(load("warm")).reason == (
        "Invalid argument: [request id: <id_unknown>] inference input 'INPUT0' data-type is "
        "'FP32', but model 'warm' expects 'INT32'"
    )


def test_a_batch_over_max_batch_size_fails(tmp_path: Path, load: Callable[[str], Model]) -> None:
    add_simple(tmp_path, "warm", SIMPLE_WARMUP.format(batch_size=9, count=1))
    assert _version(load("warm")).reason == (
        "Invalid argument: failed to run warmup sample 'zeros': batch size 9 for 'warm', max "
        "allowed is 8"
    )


def test_a_missing_input_data_file_fails_the_load_naming_it(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    add_recorder(tmp_path, "rec", warmup_of("w", "input_data_file: \"gone.bin\""))
    reason = _version(load("rec")).reason
    assert "'warmup/gone.bin'" in reason and reason.startswith("Invalid argument: "), reason


def test_decoupled_model_warmup_waits_for_each_final_response(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    decoupled = "model_transaction_policy { decoupled: true }"
    folder = add_recorder(
        tmp_path, "dec", warmup_of("w", batch_size=2, count=2), code=DECOUPLED_RECORDER,
        extra=decoupled, instances=1,
    )
    version = _version(load("dec"))
    assert version.state is State.READY, version.reason
    assert [call["requests"] for call in calls(folder)] == [2, 2]
    assert _counts(version) == (4, 2, 4, {2: 2})

    bad = add_recorder(
        tmp_path, "dec_bad", warmup_of("w", "input_data_file: \"neg\""),
        code=DECOUPLED_RECORDER, extra=decoupled, instances=1,
    )
    add_warmup_file(bad, "neg", [-1] * 4)
    assert _version(load("dec_bad")).reason == (
        "Invalid argument: failed to run warmup sample 'w': negative"
    )


def test_tensorgate_python_model_is_warmed_with_joined_inputs(
    tmp_path: Path, load: Callable[[str], Model]
) -> None:
    folder = tmp_path / "joined"
    make_models.write_text(
        'name: "joined" backend: "python" max_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_STRING dims: [ 2 ] } ]\n'
        'output [ { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        + warmup_of("s", batch_size=3).replace("INT32 dims: [ 4 ]", "STRING dims: [ 2 ]"),
        folder / "config.pbtxt",
    )
    make_models.write_text(
        "import numpy as np\n\n\nclass TensorgateModel:\n"
        "    def execute(self, inputs):\n"
        "        x = inputs['IN']\n"
        "        with open(__file__ + '.seen', 'a') as f:\n"
        "            f.write(repr((x.shape, x.ravel().tolist())) + '\\n')\n"
        "        return {'ROWS': np.full((x.shape[0], 1), x.shape[0], np.int32)}\n",
        folder / "1" / "model.py",
    )
    version = _version(load("joined"))
    assert version.state is State.READY, version.reason
    seen = (folder / "1" / "model.py.seen").read_text().splitlines()
    # the default of two CPU instances: each ran the three empty-string requests joined
    assert seen == [repr(((3, 2), [b""] * 6))] * 2
