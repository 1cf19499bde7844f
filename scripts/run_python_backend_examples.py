"""Run NVIDIA's python_backend examples, unchanged, against tensorgate; report pass or fail.

Given a checkout of python_backend (``git clone`` it anywhere), this builds each example's
model repository as the example's README says (the same copies, into a temporary folder),
starts tensorgate on it, runs the example's own client scripts and prints one line per client
and layout. With ``--server-checkout`` (a checkout of triton-inference-server/server) it also
runs two of Triton's own python-model tests the same way, as their ``test.sh`` sets them up:
``error_code`` (``qa/L0_backend_python/lifecycle``, ``test_error_code``) and
``response_parameters`` (``qa/L0_backend_python/parameters``, every test). The clients talk to ``localhost:8000`` (HTTP), ``8001`` (gRPC) and ``8002``
(metrics), which they do not let one change; so each run happens in a network namespace of
its own (``unshare --net``, which needs root) where those ports are free, unless
``--host-network`` says to use the machine's own ports.

    python scripts/run_python_backend_examples.py /path/to/python_backend \
        [--server-checkout /path/to/server]
    python scripts/run_python_backend_examples.py /path/to/python_backend --layout split \
        --example decoupled

Not a CI test (CI cannot fetch python_backend); the behaviours the examples need are covered
by tests written here. The ``bls`` examples also call a PyTorch model: without ``torch`` in the
server's interpreter that model fails to load and those clients fail at their second step.
Exit status 0 when every client passed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = {"one-process": ["--frontends=0"], "split": []}
_START_S = 120.0
_CLIENT_S = 180.0


@dataclass(frozen=True)
class Model:
    """One model of an example's repository: ``model.py`` and its config (none: the example
    relies on auto-complete), both relative to the example tree (``examples/``, ``qa/``)."""

    name: str
    code: str
    config: str | None


@dataclass(frozen=True)
class Example:
    """Its models, and its clients: scripts run with python in their folder; one with
    ``::`` is a pytest file and the test names it selects (``-k``)."""

    name: str
    models: tuple[Model, ...]
    clients: tuple[str, ...]
    needs: tuple[str, ...] = field(default=())  # modules the server must be able to import


_ADD_SUB = Model("add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
_PYTORCH = Model("pytorch", "pytorch/model.py", "pytorch/config.pbtxt")
_SQUARE = Model("square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
EXAMPLES = (
    Example("add_sub", (_ADD_SUB,), ("add_sub/client.py",)),
    Example(
        "bls_sync",
        (_ADD_SUB, Model("bls_sync", "bls/sync_model.py", "bls/sync_config.pbtxt"), _PYTORCH),
        ("bls/sync_client.py",),
        ("torch",),
    ),
    Example(
        "bls_async",
        (_ADD_SUB, Model("bls_async", "bls/async_model.py", "bls/async_config.pbtxt"), _PYTORCH),
        ("bls/async_client.py",),
        ("torch",),
    ),
    Example(
        "bls_decoupled_sync",
        (
            Model(
                "bls_decoupled_sync", "bls_decoupled/sync_model.py",
                "bls_decoupled/sync_config.pbtxt",
            ),
            _SQUARE,
        ),
        ("bls_decoupled/sync_client.py",),
    ),
    Example(
        "bls_decoupled_async",
        (
            Model(
                "bls_decoupled_async", "bls_decoupled/async_model.py",
                "bls_decoupled/async_config.pbtxt",
            ),
            _SQUARE,
        ),
        ("bls_decoupled/async_client.py",),
    ),
    Example(
        "decoupled",
        (
            Model("repeat_int32", "decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt"),
            _SQUARE,
        ),
        ("decoupled/repeat_client.py", "decoupled/square_client.py"),
    ),
    Example(
        "auto_complete",
        (
            Model("nobatch_auto_complete", "auto_complete/nobatch_model.py", None),
            Model("batch_auto_complete", "auto_complete/batch_model.py", None),
        ),
        ("auto_complete/client.py",),
    ),
    Example(
        "custom_metrics",
        (
            Model(
                "custom_metrics", "custom_metrics/model.py", "custom_metrics/config.pbtxt"
            ),
        ),
        ("custom_metrics/client.py",),
    ),
)


def _qa_model(name: str) -> Model:
    return Model(name, f"python_models/{name}/model.py", f"python_models/{name}/config.pbtxt")


#: Triton's own tests of python models (server repository, ``qa/``).
QA_TESTS = (
    Example(
        "error_code", (_qa_model("error_code"),),
        ("L0_backend_python/lifecycle/lifecycle_test.py::test_error_code",),
    ),
    Example(
        "response_parameters",
        tuple(_qa_model(f"response_parameters{kind}") for kind in ("", "_decoupled", "_bls")),
        ("L0_backend_python/parameters/response_parameters_test.py::test_",),
    ),
)


def build_repository(examples_dir: Path, example: Example, into: Path) -> None:
    """``mkdir -p models/<m>/1; cp <code> models/<m>/1/model.py; cp <config> models/<m>/``."""
    for model in example.models:
        version = into / model.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        shutil.copy(examples_dir / model.code, version / "model.py")
        if model.config is not None:
            shutil.copy(examples_dir / model.config, into / model.name / "config.pbtxt")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_loaded(server: subprocess.Popen[bytes]) -> str | None:
    """Wait until the server answers and no model is still loading; why not, or None."""
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"server exited with status {server.returncode}"
        try:
            if _get("http://localhost:8000/v2/health/ready")[0] == 200:
                return None
            request = urllib.request.Request(
                "http://localhost:8000/v2/repository/index", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(request, timeout=2) as reply:
                states = [m.get("state") for m in json.loads(reply.read())]
            if states and "LOADING" not in states:
                return None  # some model failed to load: the clients say what that costs
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    return "server not ready in time"


def run_example(
    example: Example, examples_dir: Path, layout: str, python: str, log_dir: Path
) -> list[tuple[str, bool, str]]:
    """Each client's (name, passed, last output line) for one example in one layout."""
    with tempfile.TemporaryDirectory(prefix=f"pbx-{example.name}-") as repo:
        build_repository(examples_dir, example, Path(repo))
        log_path = log_dir / f"{example.name}-{layout}.server.log"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        with log_path.open("wb") as log:
            server = subprocess.Popen(
                [python, "-m", "server", f"--model-repository={repo}", "--exit-on-error=false",
                 *LAYOUTS[layout]],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        try:
            why = wait_loaded(server)
            if why is not None:
                return [(client, False, why) for client in example.clients]
            return [
                _run_client(examples_dir / client, python, log_dir, example.name, layout)
                for client in example.clients
            ]
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _run_client(
    client: Path, python: str, log_dir: Path, example: str, layout: str
) -> tuple[str, bool, str]:
    script = Path(str(client).split("::")[0])
    name = f"{script.parent.name}/{client.name}"
    command, env = [python, str(script)], None
    if "::" in str(client):
        command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script),
                   "-k", str(client).split("::")[1]]
        # Their shared-memory leak probe reads the python backend's own regions (a compiled
        # helper tensorgate has no use for); TEST_JETSON is their switch to skip it.
        env = dict(os.environ, TEST_JETSON="1")
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=_CLIENT_S, cwd=script.parent, check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return name, False, f"client ran over {_CLIENT_S:.0f} s"
    output = (done.stdout + done.stderr).decode(errors="replace")
    (log_dir / f"{example}-{layout}-{script.stem}.client.log").write_text(output)
    lines = [line for line in output.splitlines() if line.strip()]
    return name, done.returncode == 0, lines[-1] if lines else f"exit {done.returncode}"


def _importable(python: str, module: str) -> bool:
    return subprocess.run(
        [python, "-c", f"import {module}"], capture_output=True, check=False
    ).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a python_backend checkout")
    parser.add_argument("--server-checkout", type=Path,
                        help="a triton-inference-server/server checkout: run its qa tests too")
    parser.add_argument("--layout", choices=[*LAYOUTS, "both"], default="both")
    parser.add_argument("--example", action="append",
                        choices=[e.name for e in (*EXAMPLES, *QA_TESTS)],
                        help="run only these (repeatable); default: all")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter for the server and the clients (needs tritonclient)")
    parser.add_argument("--logs", type=Path, help="keep server and client logs here")
    parser.add_argument("--host-network", action="store_true",
                        help="use this machine's ports 8000-8002 (no network namespace)")
    args = parser.parse_args(argv)
    if not args.host_network and os.environ.get("PBX_IN_NETNS") != "1":
        # The clients' fixed ports: run in a namespace of our own with only a loopback.
        command = [
            "unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
            sys.executable, *sys.argv,
        ]
        return subprocess.call(command, env=dict(os.environ, PBX_IN_NETNS="1"))
    examples_dir = args.checkout / "examples"
    if not examples_dir.is_dir():
        parser.error(f"no examples/ in {args.checkout}")
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    trees = [(examples_dir, e) for e in EXAMPLES]
    if args.server_checkout is not None:
        trees += [(args.server_checkout / "qa", e) for e in QA_TESTS]
    chosen = [(tree, e) for tree, e in trees if not args.example or e.name in args.example]
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="pbx-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for tree, example in chosen:
        missing = [m for m in example.needs if not _importable(args.python, m)]
        note = f" (without {', '.join(missing)})" if missing else ""
        for layout in layouts:
            for client, passed, last in run_example(
                example, tree, layout, args.python, log_dir
            ):
                failed += not passed
                verdict = "PASS" if passed else "FAIL"
                print(f"{verdict}  {layout:11}  {client:34} {last[:100]}{note}", flush=True)
    print(f"logs in {log_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
