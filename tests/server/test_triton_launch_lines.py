"""Every launch line of Triton's Helm charts and of KServe's Triton runtime starts tensorgate,
and it serves.

The lines are facts collected from their sources (repository and file named at each), with the
Helm and KServe template values resolved to the defaults those files give them, as the
container receives its ``args``. A test changes only what a test machine cannot take as written:
the model repository becomes this checkout's example repository, and every port (those the
line sets, and Triton's fixed defaults 8000, 8001 and 8002 where it sets none) becomes a free
one. Every other flag is kept exactly as written. A line whose repository is in cloud storage
must be refused as written (exit status 1, a message naming the flag), and serve once the
repository is a local folder.

The suite runs in both process layouts (``TENSORGATE_TEST_FRONTENDS``, see
``tests/server_process.py``), so each line is started in both.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from server.cli import parse_command_line
from server.triton_flags import CLOUD_PREFIXES
from tests.server.http.helpers import assert_simple_ok
from tests.server_process import EXAMPLES, ROOT, ServerProcess

REPOSITORY_FLAGS = ("--model-repository", "--model-store")
PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")


@dataclass(frozen=True)
class LaunchLine:
    """A container's arguments as Kubernetes hands them to the image (the program word
    first), and the files they come from (``owner/repo: path``)."""

    sources: tuple[str, ...]
    args: tuple[str, ...]


_TRITON = "triton-inference-server/server"
_KSERVE = "kserve/kserve"
_GKE_CHART = "deploy/gke-marketplace-app/server-deployer/chart/triton"


def _triton(*paths: str) -> tuple[str, ...]:
    return tuple(f"{_TRITON}: {path}" for path in paths)


def _kserve(*paths: str) -> tuple[str, ...]:
    return tuple(f"{_KSERVE}: {path}" for path in paths)


#: The launch lines, by a short name. Triton's charts are those of release 2.51 (tag v2.51.0;
#: the launch lines are unchanged at the default branch as of 2.73), KServe's files are those
#: of its default branch.
LAUNCH_LINES: dict[str, LaunchLine] = {
    # deploy/aws/templates/deployment.yaml `args`, with image.modelRepositoryPath from
    # deploy/aws/values.yaml.
    "aws": LaunchLine(
        _triton("deploy/aws/templates/deployment.yaml", "deploy/aws/values.yaml"),
        ("tritonserver", "--model-store=s3://triton-inference-server-repository/model_repository",
         "--model-control-mode=poll", "--repository-poll-secs=5"),
    ),
    # deploy/gcp/templates/deployment.yaml `args`, with image.modelRepositoryPath from
    # deploy/gcp/values.yaml.
    "gcp": LaunchLine(
        _triton("deploy/gcp/templates/deployment.yaml", "deploy/gcp/values.yaml"),
        ("tritonserver",
         "--model-store=gs://triton-inference-server-repository/model_repository"),
    ),
    # deploy/oci/templates/deployment.yaml `args` (the aws ones), with image.modelRepositoryPath
    # from deploy/oci/values.yaml, its <OCI_NAMESPACE> and <OCI_REGION> left for the user.
    "oci": LaunchLine(
        _triton("deploy/oci/templates/deployment.yaml", "deploy/oci/values.yaml"),
        ("tritonserver",
         ("--model-store=s3://https://<OCI_NAMESPACE>.compat.objectstorage.<OCI_REGION>"
          ".oraclecloud.com:443/triton-inference-server-repository"),
         "--model-control-mode=poll", "--repository-poll-secs=5"),
    ),
    # deploy/gke-marketplace-app/server-deployer/chart/triton/templates/deployment.yaml `args`,
    # with modelRepositoryPath and image.strictModelConfig (False), image.logVerboseLevel (0)
    # and image.allowGPUMetrics (True) from that chart's values.yaml (the defaults of
    # deploy/gke-marketplace-app/server-deployer/schema.yaml too); Helm prints YAML booleans
    # as false and true.
    "gke-marketplace-app": LaunchLine(
        _triton(f"{_GKE_CHART}/templates/deployment.yaml", f"{_GKE_CHART}/values.yaml"),
        ("tritonserver", "--model-store=gs://triton_sample_models/24.09",
         "--strict-model-config=false", "--log-verbose=0", "--allow-gpu-metrics=true"),
    ),
    # deploy/k8s-onprem/templates/deployment.yaml `args`: tritonserver and each of serverArgs
    # from deploy/k8s-onprem/values.yaml. The same line is Triton's non-root example in
    # docs/customization_guide/deploy.md (`docker run ... tritonserver
    # --model-repository=/models`).
    "k8s-onprem": LaunchLine(
        _triton("deploy/k8s-onprem/templates/deployment.yaml", "deploy/k8s-onprem/values.yaml",
                "docs/customization_guide/deploy.md"),
        ("tritonserver", "--model-repository=/models"),
    ),
    # deploy/fleetcommand/templates/deployment.yaml `args`: image.serverCommand (tritonserver)
    # and each of image.serverArgs from deploy/fleetcommand/values.yaml. Its serverArgs are
    # only comments there (the chart does not render until some are given: `required`): these
    # are the commented ones, the repository and each --model-control-mode it names
    # (explicit|poll|none).
    **{
        f"fleetcommand-{mode}": LaunchLine(
            _triton("deploy/fleetcommand/templates/deployment.yaml",
                    "deploy/fleetcommand/values.yaml"),
            ("tritonserver",
             "--model-repository=s3://triton-inference-server-repository/model_repository",
             f"--model-control-mode={mode}"),
        )
        for mode in ("explicit", "poll", "none")
    },
    # deploy/alibaba-cloud/README.md: the EAS service's processor_params (EAS's `triton`
    # processor runs tritonserver with them). oss:// is no storage tritonserver reads.
    "alibaba-cloud": LaunchLine(
        _triton("deploy/alibaba-cloud/README.md"),
        ("tritonserver", "--model-repository=oss://triton-model-repo/models",
         "--allow-grpc=true", "--allow-http=true"),
    ),
    # KServe's kserve-tritonserver ClusterServingRuntime `args` (no {{.Name}}-style
    # placeholders to substitute); the same in the Helm chart's copies.
    "kserve-tritonserver": LaunchLine(
        _kserve("config/runtimes/kserve-tritonserver.yaml",
                "charts/kserve-runtime-configs/files/runtimes/resources.yaml",
                "charts/kserve-runtime-configs/files/runtimes/clusterservingruntimes-patch.yaml"),
        ("tritonserver", "--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
         "--allow-grpc=true", "--allow-http=true"),
    ),
    # KServe's multi-model serving: an InferenceService of the runtime without a storage URI
    # gets --model-control-mode=explicit appended to its args (SetTritonDefaults in
    # pkg/apis/serving/v1beta1/inference_service_defaults.go), after the sample's own
    # --log-verbose=1 (docs/samples/multimodelserving/triton/multi_model_triton.yaml), and the
    # runtime's args come first (MergeRuntimeContainers in
    # pkg/controller/v1beta1/inferenceservice/utils/utils.go). TrainedModels are then loaded
    # through the repository API.
    "kserve-tritonserver-multi-model": LaunchLine(
        _kserve("config/runtimes/kserve-tritonserver.yaml",
                "pkg/apis/serving/v1beta1/inference_service_defaults.go",
                "docs/samples/multimodelserving/triton/multi_model_triton.yaml",
                "pkg/controller/v1beta1/inferenceservice/utils/utils.go"),
        ("tritonserver", "--model-store=/mnt/models", "--grpc-port=9000", "--http-port=8080",
         "--allow-grpc=true", "--allow-http=true", "--log-verbose=1",
         "--model-control-mode=explicit"),
    ),
}


def _flag_value(word: str, flags: Sequence[str]) -> str | None:
    """The value of ``--flag=value`` when ``word`` is one of ``flags`` in that form."""
    name, eq, value = word.partition("=")
    return value if eq and name in flags else None


def repository(args: Sequence[str]) -> str:
    """The one model repository a line names (every line here writes ``--flag=value``)."""
    (path,) = [v for w in args if (v := _flag_value(w, REPOSITORY_FLAGS)) is not None]
    return path


def with_repository(args: Sequence[str], path: Path) -> list[str]:
    """``args`` with the model repository's value replaced by ``path``."""
    return [
        f"{w.partition('=')[0]}={path}" if _flag_value(w, REPOSITORY_FLAGS) is not None else w
        for w in args
    ]


def with_free_ports(args: Sequence[str]) -> list[str]:
    """``args`` with every port free: the ports a line sets become 0 (pick a free one), and a
    port it leaves at Triton's fixed default is given as 0 at the end."""
    words = [
        f"{w.partition('=')[0]}=0" if _flag_value(w, PORT_FLAGS) is not None else w
        for w in args
    ]
    given = {w.partition("=")[0] for w in words}
    return words + [f"{flag}=0" for flag in PORT_FLAGS if flag not in given]


def local_line(args: Sequence[str], path: Path = EXAMPLES) -> tuple[str, ...]:
    return tuple(with_free_ports(with_repository(args, path)))


def _is_cloud(line: LaunchLine) -> bool:
    return repository(line.args).startswith(CLOUD_PREFIXES)


def _served_lines() -> dict[tuple[str, ...], list[str]]:
    """The lines to start, once per distinct flag set (after the substitutions), with the
    names of the launch lines each one stands for."""
    distinct: dict[tuple[str, ...], list[str]] = {}
    for name, line in LAUNCH_LINES.items():
        distinct.setdefault(local_line(line.args), []).append(name)
    return distinct


SERVED = _served_lines()
CLOUD = [name for name, line in LAUNCH_LINES.items() if _is_cloud(line)]


def test_the_lines_are_the_collected_facts() -> None:
    """Each line starts with the program word, names one repository, cites its sources, and
    the substitutions touch nothing but the repository and the ports."""
    for name, line in LAUNCH_LINES.items():
        assert line.args[0] == "tritonserver" and line.sources, name
        assert all(s.startswith((f"{_TRITON}: ", f"{_KSERVE}: ")) for s in line.sources), name
        local = local_line(line.args)
        kept = [w for w in line.args if _flag_value(w, (*REPOSITORY_FLAGS, *PORT_FLAGS)) is None]
        assert [w for w in local if w in kept] == kept, name
        assert repository(local) == str(EXAMPLES), name
        assert {w for w in local if _flag_value(w, PORT_FLAGS) is not None} == {
            f"{flag}=0" for flag in PORT_FLAGS
        }, name
    # the cloud ones: s3:// (also with an endpoint in it) and gs://
    assert CLOUD == ["aws", "gcp", "oci", "gke-marketplace-app", "fleetcommand-explicit",
                     "fleetcommand-poll", "fleetcommand-none"]
    # identical flag sets started once: aws and oci differ only in their bucket
    assert ["aws", "oci"] in SERVED.values()
    assert len(SERVED) == len(LAUNCH_LINES) - 1


def _run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=60, check=False,
    )


@pytest.mark.parametrize("name", CLOUD)
def test_a_cloud_repository_is_refused_as_written(name: str) -> None:
    """Exit status 1 before any port opens, naming the flag as the line writes it (its ports
    made free all the same, should it start)."""
    args = LAUNCH_LINES[name].args
    result = _run(with_free_ports(args))
    flag = next(w for w in args if _flag_value(w, REPOSITORY_FLAGS) is not None)
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"Error: {flag} is not supported by tensorgate: "), result
    assert "mount the models as a local folder" in result.stderr
    assert "Started" not in result.stdout + result.stderr


def test_an_oss_repository_fails_at_start_as_a_missing_folder() -> None:
    """tritonserver reads no oss:// storage: such a path is a local folder that is not there,
    and the start fails naming it (exit status 1)."""
    args = LAUNCH_LINES["alibaba-cloud"].args
    result = _run(with_free_ports(args))
    assert result.returncode == 1, result
    output = result.stdout + result.stderr
    assert "failed to stat model repository path 'oss://triton-model-repo/models'" in output
    assert "Started" not in output


SIMPLE_INPUTS = (np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32))


def _assert_ready(server: ServerProcess) -> None:
    """``/v2/health/ready`` answers 200, what the charts' readiness probes wait for: models are
    loaded before the ports open, so at once."""
    status, _, body = server.request("GET", "/v2/health/ready")
    assert status == 200, (status, body, server.log)


def _grpc_infer(server: ServerProcess) -> None:
    inputs = SIMPLE_INPUTS
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_server_ready()
        tensors = []
        for name, array in zip(("INPUT0", "INPUT1"), inputs, strict=True):
            tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer("simple", tensors)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), inputs[0] + inputs[1])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), inputs[0] - inputs[1])
    finally:
        client.close()


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """The servers a test starts, stopped after it (each must exit 0)."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        assert server.stop() == 0, server.log


@pytest.mark.parametrize("args", list(SERVED), ids=["+".join(n) for n in SERVED.values()])
def test_the_line_serves(args: tuple[str, ...], started: list[ServerProcess]) -> None:
    """Ready, and one inference on ``simple`` over HTTP and (where the line allows it) gRPC."""
    settings = parse_command_line(args, environ={}).settings
    server = ServerProcess(list(args))
    started.append(server)
    assert server.port is not None, server.log
    _assert_ready(server)
    if settings.model_control_mode == "explicit":
        # nothing is loaded at start; load it through the repository API, as KServe's
        # multi-model serving loads a TrainedModel
        assert server.request("GET", "/v2/models/simple/ready")[0] == 400
        status, _, body = server.request("POST", "/v2/repository/models/simple/load", b"{}")
        assert status == 200, body
        _assert_ready(server)
    status, _, body = server.request("GET", "/v2/models/simple/ready")
    assert status == 200, body
    assert_simple_ok(server)
    if settings.allow_grpc:
        _grpc_infer(server)
    status, _, body = server.request("GET", "/v2")
    assert status == 200 and json.loads(body)["name"] == "triton", body
