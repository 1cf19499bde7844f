"""The ``tensorgate`` / ``tritonserver`` command: Triton launch lines start a serving server,
warnings about options without effect are logged once whatever the process layout, and a
refused option stops the start naming it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import types
from collections.abc import Sequence
from pathlib import Path

import pytest

from server import main as main_module
from server.settings import Settings
from tests.server.http.helpers import assert_simple_ok
from tests.server_process import DEFAULT_ARGS, EXAMPLES, ROOT, ServerProcess

THREADS_WARNING = "--http-thread-count=4 has no effect in tensorgate (ignored)"
SAGEMAKER_WARNING = "--allow-sagemaker=false has no effect in tensorgate (ignored)"


@pytest.mark.usefixtures("root_logging")
def test_main_drops_the_program_word_and_logs_each_warning_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[Settings] = []

    async def serve(settings: Settings) -> int:
        served.append(settings)
        return 0

    monkeypatch.setitem(sys.modules, "server.app", types.SimpleNamespace(serve=serve))
    log_file = tmp_path / "server.log"
    code = main_module.main(
        ["tritonserver", "--model-store=/m", "--frontends=0", f"--log-file={log_file}",
         "--http-thread-count=4", "--allow-sagemaker=false", "--http-thread-count", "4"]
    )
    assert code == 0
    assert served[0].model_repositories == ("/m",)
    lines = log_file.read_text().splitlines()
    assert [line for line in lines if "has no effect" in line] == [
        line for line in lines if THREADS_WARNING in line or SAGEMAKER_WARNING in line
    ]
    assert sum(THREADS_WARNING in line for line in lines) == 1
    assert sum(SAGEMAKER_WARNING in line for line in lines) == 1
    assert all(line.startswith("W") for line in lines if "has no effect" in line)


@pytest.mark.usefixtures("root_logging")
def test_main_hands_the_command_line_to_the_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    from server.processes import supervisor

    handed: list[tuple[Settings, list[str]]] = []

    def fake_run(settings: Settings, argv: Sequence[str]) -> int:
        handed.append((settings, list(argv)))
        return 0

    monkeypatch.setattr(supervisor, "run", fake_run)
    words = ["tritonserver", "--model-repository=/m", "--frontends=2"]
    assert main_module.main(words) == 0
    ((settings, argv),) = handed
    assert settings.frontend_count() == 2 and argv == words  # each child re-reads them


def test_main_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "tritonserver", "--version"], cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0 and result.stdout.startswith("tensorgate ")


@pytest.mark.parametrize("name", ["tritonserver", "tensorgate"])
def test_the_installed_console_script_is_this_main(name: str) -> None:
    """The command pods run (``tritonserver``, or ``tensorgate``) is ``server.main.main`` as
    installed, and its script starts it: a launch line without the program word works."""
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=name)
    assert entry.load() is main_module.main
    script = Path(sysconfig.get_path("scripts")) / name
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's server package
    version = subprocess.run(
        [script, "--version"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert version.returncode == 0 and version.stdout.startswith("tensorgate "), version
    refused = subprocess.run(
        [script, "--model-store=gs://bucket/models"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=60, check=False,
    )
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("Error: --model-store=gs://bucket/models is not supported")


def _kserve_line(repository: Path, *extra: str) -> list[str]:
    """KServe's Triton runtime's arguments (with free ports, metrics on one too)."""
    return [
        "tritonserver", f"--model-store={repository}", "--grpc-port=0", "--http-port=0",
        "--allow-grpc=true", "--allow-http=true", "--metrics-port=0", *DEFAULT_ARGS, *extra,
    ]


def test_kserves_launch_line_serves_and_warns_once() -> None:
    server = ServerProcess(
        _kserve_line(EXAMPLES, "--http-thread-count=4", "--allow-sagemaker=false",
                     "--grpc-keepalive-time=60000", "--log-info=true")
    )
    try:
        assert server.port is not None and server.grpc_port is not None, server.log
        assert_simple_ok(server)
        assert server.log.count(THREADS_WARNING) == 1, server.log
        assert server.log.count(SAGEMAKER_WARNING) == 1, server.log
    finally:
        assert server.stop() == 0


def test_flags_from_the_environment_start_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("MODEL_REPOSITORY", str(EXAMPLES)), ("HTTP_PORT", "0"), ("GRPC_PORT", "0"),
        ("METRICS_PORT", "0"), ("HTTP_ADDRESS", "127.0.0.1"), ("GRPC_ADDRESS", "127.0.0.1"),
        ("BACKEND_CONFIG", "onnxruntime,intra_op_thread_count=1"), ("HTTP_THREAD_COUNT", "4"),
        ("ID", "from-env"),
    ):
        monkeypatch.setenv(f"TENSORGATE_{name}", value)
    server = ServerProcess(["--id=from-line"])
    try:
        assert server.port is not None and server.grpc_port is not None, server.log
        assert_simple_ok(server)
        status, _, body = server.request("GET", "/v2")
        assert status == 200 and b'"name":"from-line"' in body.replace(b" ", b"")
        assert server.log.count(THREADS_WARNING) == 1, server.log
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    "flag",
    ["--rate-limit=execution_count", "--host-policy=numa,cpu-cores=0", "--model-namespacing=true"],
)
def test_a_refused_flag_stops_the_start_naming_it(flag: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *_kserve_line(EXAMPLES, flag)], cwd=ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {flag} is not supported by tensorgate: ")
    assert "Started" not in result.stderr + result.stdout


def test_an_unknown_flag_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *_kserve_line(EXAMPLES, "--grpc-infer-thread-counts=2")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --grpc-infer-thread-counts=2" in result.stderr
