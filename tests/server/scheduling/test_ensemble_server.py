"""Ensembles served by the real server, over HTTP and gRPC, in one process and split: a
python → ONNX → python pipeline, a diamond whose two middle steps run at once, the ensemble's
and composing models' statistics, metadata and config, and explicit-mode load and unload
(``unload_dependents``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.server_process import EXAMPLES, ServerProcess, start_server


def _python_model(name: str, inputs: str, outputs: str, body: str, extra: str = "") -> tuple[str, str]:
    """A Triton-style python model: config and ``model.py`` whose execute computes ``body``
    (a dict of output name -> numpy expression of the inputs, bound by name)."""
    config = (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        f"input [ {inputs} ]\noutput [ {outputs} ]\n{extra}"
    )
    code = f"""import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            names = [t.name() for t in request.inputs()]
            values = {{n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in names}}
            out = ({body})(**values)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(k, v) for k, v in out.items()]
            ))
        return responses
"""
    return config, code


def _int(name: str) -> str:
    return f'{{ name: "{name}" data_type: TYPE_INT32 dims: [ 16 ] }}'


PYTHON_MODELS = {
    # A = 2 RAW, B = RAW + 1
    "pre": _python_model(
        "pre", _int("RAW"), f"{_int('A')}, {_int('B')}",
        "lambda RAW: {'A': RAW * 2, 'B': RAW + 1}",
    ),
    # OUT = 10 SUM - DIFF, as FP32
    "post": _python_model(
        "post", f"{_int('SUM')}, {_int('DIFF')}",
        '{ name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }',
        "lambda SUM, DIFF: {'OUT': (SUM * 10 - DIFF).astype(np.float32)}",
    ),
    # Y = 2 X after 0.4 s; two instances, so two requests run at once
    "slow_double": _python_model(
        "slow_double", _int("X"), _int("Y"),
        "lambda X: (time.sleep(0.4), {'Y': X * 2})[1]",
        "instance_group [ { kind: KIND_CPU count: 2 } ]\n",
    ),
}

PIPELINE = """name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }
]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1
    input_map { key: "RAW" value: "RAW" }
    output_map { key: "A" value: "a" } output_map { key: "B" value: "b" } },
  { model_name: "simple" model_version: 1
    input_map { key: "INPUT0" value: "a" } input_map { key: "INPUT1" value: "b" }
    output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "diff" } },
  { model_name: "post" model_version: -1
    input_map { key: "SUM" value: "SUM" } input_map { key: "DIFF" value: "diff" }
    output_map { key: "OUT" value: "OUT" } }
] }
"""

DIAMOND = """name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "RAW" value: "RAW" }
    output_map { key: "A" value: "a" } output_map { key: "B" value: "b" } },
  { model_name: "slow_double" model_version: -1 input_map { key: "X" value: "a" } output_map { key: "Y" value: "left" } },
  { model_name: "slow_double" model_version: -1 input_map { key: "X" value: "b" } output_map { key: "Y" value: "right" } },
  { model_name: "simple" model_version: -1 input_map { key: "INPUT0" value: "left" }
    input_map { key: "INPUT1" value: "right" }
    output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""

#: an ensemble naming a model the repository does not have
BROKEN = PIPELINE.replace('name: "pipeline"', 'name: "broken"').replace(
    'model_name: "post"', 'model_name: "nowhere"'
)


def build_repository(root: Path) -> Path:
    for name, (config, code) in PYTHON_MODELS.items():
        make_models.write_text(config, root / name / "config.pbtxt")
        make_models.write_text(code, root / name / "1" / "model.py")
    shutil.copytree(EXAMPLES / "simple", root / "simple")
    for name, config in (("pipeline", PIPELINE), ("diamond", DIAMOND), ("broken", BROKEN)):
        make_models.write_text(config, root / name / "config.pbtxt")
        (root / name / "1").mkdir()
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("ensemble_repo"))


@pytest.fixture(scope="module", params=["0", "1"], ids=["one-process", "split"])
def server(request: pytest.FixtureRequest, repository: Path) -> Iterator[ServerProcess]:
    """Every model but ``broken`` loaded at start (each ensemble after its composing models)."""
    process = start_server(
        repository,
        args=(
            f"--frontends={request.param}",
            "--model-control-mode=explicit",
            "--load-model=pipeline",
            "--load-model=diamond",
        ),
    )
    assert process.port is not None, process.log
    yield process
    process.stop()


def _raw(rows: int) -> np.ndarray:
    return np.arange(rows * 16, dtype=np.int32).reshape(rows, 16)


def _infer(client: Any, module: Any, model: str, raw: np.ndarray, outputs: list[str]) -> Any:
    tensor = module.InferInput("RAW", list(raw.shape), "INT32")
    tensor.set_data_from_numpy(raw)
    wanted = [module.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, [tensor], outputs=wanted)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_pipeline_outputs(
    server: ServerProcess, transport: str, connect: Callable[..., Any]
) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = connect(module, server.url if transport == "http" else server.grpc_url)
    raw = _raw(3)
    result = _infer(client, module, "pipeline", raw, ["OUT", "SUM"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * raw + 11).astype(np.float32))
    np.testing.assert_array_equal(result.as_numpy("SUM"), 3 * raw + 1)
    only = _infer(client, module, "pipeline", raw, ["SUM"])
    assert only.as_numpy("OUT") is None
    np.testing.assert_array_equal(only.as_numpy("SUM"), 3 * raw + 1)


def test_diamond_runs_its_middle_steps_at_once(
    server: ServerProcess, connect: Callable[..., Any]
) -> None:
    client = connect(httpclient, server.url)
    raw = _raw(1)
    _infer(client, httpclient, "diamond", raw, ["OUT"])  # warm
    started = time.perf_counter()
    result = _infer(client, httpclient, "diamond", raw, ["OUT"])
    elapsed = time.perf_counter() - started
    np.testing.assert_array_equal(result.as_numpy("OUT"), 6 * raw + 2)
    assert elapsed < 0.75, elapsed  # one after the other would take 0.8 s


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    entry: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return entry


def test_statistics_of_ensemble_and_composing_models(
    server: ServerProcess, connect: Callable[..., Any]
) -> None:
    client = connect(httpclient, server.url)
    names = ("pipeline", "pre", "simple", "post")
    before = {name: _stats(client, name) for name in names}
    for _ in range(3):
        _infer(client, httpclient, "pipeline", _raw(2), ["OUT"])
    after = {name: _stats(client, name) for name in names}

    def delta(name: str, *path: str) -> int:
        old: Any = before[name]
        new: Any = after[name]
        for key in path:
            old, new = old[key], new[key]
        return int(new) - int(old)

    assert delta("pipeline", "inference_stats", "success", "count") == 3
    assert delta("pipeline", "inference_count") == 6
    assert delta("pipeline", "execution_count") == 3
    for name in ("pre", "simple", "post"):
        assert delta(name, "inference_stats", "success", "count") == 3
        assert delta(name, "inference_count") == 6
    for part in ("compute_input", "compute_infer", "compute_output"):
        composing = sum(delta(n, "inference_stats", part, "ns") for n in ("pre", "simple", "post"))
        assert delta("pipeline", "inference_stats", part, "ns") == composing, part
        assert delta("pipeline", "inference_stats", part, "count") == 3
    batch = {b["batch_size"]: b for b in after["pipeline"]["batch_stats"]}
    assert batch[2]["compute_infer"]["count"] >= 3


def test_metadata_and_config(server: ServerProcess, connect: Callable[..., Any]) -> None:
    client = connect(httpclient, server.url)
    metadata = client.get_model_metadata("pipeline")
    assert metadata["platform"] == "ensemble"
    assert [t["name"] for t in metadata["outputs"]] == ["OUT", "SUM"]
    assert metadata["inputs"] == [{"name": "RAW", "datatype": "INT32", "shape": [-1, 16]}]
    config = client.get_model_config("pipeline")
    assert config["platform"] == "ensemble"
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["pre", "simple", "post"]
    assert config["instance_group"] == []
    grpc = connect(grpcclient, server.grpc_url)
    assert grpc.get_model_metadata("pipeline").platform == "ensemble"


def test_composing_error_is_prefixed(server: ServerProcess, connect: Callable[..., Any]) -> None:
    client = connect(httpclient, server.url)
    tensor = httpclient.InferInput("RAW", [9, 16], "INT32")
    tensor.set_data_from_numpy(_raw(9))
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8 for 'pipeline'"):
        client.infer("pipeline", [tensor])
    raw = _raw(8)  # the largest batch still serves
    result = _infer(client, httpclient, "pipeline", raw, ["OUT"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * raw + 11).astype(np.float32))


def test_unknown_composing_model_fails_the_load(
    server: ServerProcess, connect: Callable[..., Any]
) -> None:
    client = connect(httpclient, server.url)
    with pytest.raises(
        InferenceServerException,
        match="ensemble broken contains models that are not available or ambiguous: nowhere",
    ):
        client.load_model("broken")
    raw = _raw(2)  # the failed load leaves the others serving
    result = _infer(client, httpclient, "pipeline", raw, ["OUT"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * raw + 11).astype(np.float32))


@pytest.fixture
def explicit(repository: Path) -> Iterator[ServerProcess]:
    """A server with nothing loaded."""
    process = start_server(repository, args=("--model-control-mode=explicit",))
    assert process.port is not None, process.log
    yield process
    process.stop()


def _ready(client: httpclient.InferenceServerClient) -> set[str]:
    return {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}


def test_explicit_load_loads_composing_models_and_unload_dependents(
    explicit: ServerProcess,
    connect: Callable[..., Any],
) -> None:
    client = connect(httpclient, explicit.url)
    client.load_model("pipeline")
    assert _ready(client) == {"pipeline", "pre", "simple", "post"}
    client.load_model("diamond")
    assert _ready(client) == {"pipeline", "diamond", "pre", "simple", "post", "slow_double"}
    # both serve at once: two requests in flight on one client of two connections
    client_of_two = connect(httpclient, explicit.url, concurrency=2)
    pending = []
    for model in ("pipeline", "diamond"):
        tensor = httpclient.InferInput("RAW", [1, 16], "INT32")
        tensor.set_data_from_numpy(_raw(1))
        pending.append(client_of_two.async_infer(model, [tensor]))
    results = [request.get_result() for request in pending]
    np.testing.assert_array_equal(
        results[0].as_numpy("OUT"), (29 * _raw(1) + 11).astype(np.float32)
    )
    np.testing.assert_array_equal(results[1].as_numpy("OUT"), 6 * _raw(1) + 2)
    # pre and simple are still used by diamond; post goes with pipeline
    client.unload_model("pipeline", unload_dependents=True)
    assert _ready(client) == {"diamond", "pre", "simple", "slow_double"}
    client.unload_model("diamond")  # without dependents: the composing models stay
    assert _ready(client) == {"pre", "simple", "slow_double"}
    client.load_model("pipeline")
    grpc = connect(grpcclient, explicit.grpc_url)
    grpc.unload_model("pipeline", unload_dependents=True)
    # loaded as composing models only, and in no ensemble still loaded: all go
    assert _ready(client) == {"slow_double"}
    client.load_model("simple")  # by name: unload_dependents leaves it
    client.load_model("pipeline")
    client.unload_model("pipeline", unload_dependents=True)
    assert _ready(client) == {"simple", "slow_double"}


def _state(client: httpclient.InferenceServerClient, name: str) -> tuple[str, str]:
    (entry,) = [m for m in client.get_model_repository_index() if m["name"] == name]
    return entry.get("state", ""), entry.get("reason", "")


def test_an_ensemble_is_unavailable_while_a_composing_model_is_unloaded(
    explicit: ServerProcess,
    connect: Callable[..., Any],
) -> None:
    client = connect(httpclient, explicit.url)
    grpc = connect(grpcclient, explicit.grpc_url)
    client.load_model("pipeline")
    client.load_model("diamond")
    client.unload_model("post")  # pipeline's last step; diamond does not use it
    # Triton unloads the ensemble: unavailable, "unloaded", and the server stays ready
    assert _state(client, "pipeline") == ("UNAVAILABLE", "unloaded")
    assert not client.is_model_ready("pipeline") and client.is_model_ready("diamond")
    assert client.is_server_ready()
    for module, transport in ((httpclient, client), (grpcclient, grpc)):
        with pytest.raises(InferenceServerException) as refused:
            _infer(transport, module, "pipeline", _raw(1), ["OUT"])
        assert "Request for unknown model: 'pipeline' has no available versions" in str(
            refused.value
        )
    client.load_model("post")  # back: so is the ensemble
    assert _state(client, "pipeline")[0] == "READY"
    result = _infer(grpc, grpcclient, "pipeline", _raw(2), ["OUT"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * _raw(2) + 11).astype(np.float32))
    # unloaded by name while unavailable, it stays unloaded when its model comes back
    client.unload_model("pre")  # both ensembles use it
    assert not client.is_model_ready("pipeline") and not client.is_model_ready("diamond")
    client.unload_model("diamond")
    client.load_model("pre")
    assert client.is_model_ready("pipeline") and not client.is_model_ready("diamond")
    result = _infer(client, httpclient, "pipeline", _raw(3), ["OUT"])
    np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * _raw(3) + 11).astype(np.float32))


def _wait_state(client: httpclient.InferenceServerClient, name: str, state: str) -> None:
    deadline = time.monotonic() + 30
    while _state(client, name)[0] != state:
        assert time.monotonic() < deadline, client.get_model_repository_index()
        time.sleep(0.1)


def test_poll_mode_a_removed_composing_model_takes_its_ensemble_until_it_is_back(
    tmp_path: Path,
    connect: Callable[..., Any],
) -> None:
    root = build_repository(tmp_path / "models")
    shutil.rmtree(root / "broken")
    process = start_server(
        root, args=("--model-control-mode=poll", "--repository-poll-secs=1")
    )
    try:
        assert process.port is not None, process.log
        client = connect(httpclient, process.url)
        (root / "post").rename(tmp_path / "post")
        _wait_state(client, "pipeline", "UNAVAILABLE")
        assert client.is_model_ready("diamond") and client.is_server_ready()
        (tmp_path / "post").rename(root / "post")
        _wait_state(client, "pipeline", "READY")
        result = _infer(client, httpclient, "pipeline", _raw(1), ["OUT"])
        np.testing.assert_array_equal(
            result.as_numpy("OUT"), (29 * _raw(1) + 11).astype(np.float32)
        )
    finally:
        process.stop()


def test_loading_every_model_loads_ensembles_after_composing_ones(
    tmp_path: Path, connect: Callable[..., Any]
) -> None:
    root = build_repository(tmp_path)
    shutil.rmtree(root / "broken")
    process = start_server(root)  # model control mode none: every model at start
    try:
        assert process.port is not None, process.log
        client = connect(httpclient, process.url)
        assert {"pipeline", "diamond"} <= _ready(client)
        result = _infer(client, httpclient, "pipeline", _raw(1), ["OUT"])
        np.testing.assert_array_equal(result.as_numpy("OUT"), (29 * _raw(1) + 11).astype(np.float32))
    finally:
        process.stop()
