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
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.example_runs import LAYOUTS, importable, run_client, serving, tensorgate_command

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


def run_example(
    example: Example, examples_dir: Path, layout: str, python: str, log_dir: Path
) -> list[tuple[str, bool, str]]:
    """Each client's (name, passed, last output line) for one example in one layout."""
    with tempfile.TemporaryDirectory(prefix=f"pbx-{example.name}-") as repo:
        build_repository(examples_dir, example, Path(repo))
        command = tensorgate_command(python, Path(repo), layout)
        log_path = log_dir / f"{example.name}-{layout}.server.log"
        with serving(command, "localhost:8000", log_path) as why:
            if why is not None:
                return [(client, False, why) for client in example.clients]
            return [
                _run_client(examples_dir / client, python, log_dir, example.name, layout)
                for client in example.clients
            ]


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
    log_path = log_dir / f"{example}-{layout}-{script.stem}.client.log"
    run = run_client(command, script.parent, log_path, _CLIENT_S, env)
    return name, run.passed, run.last


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
        missing = [m for m in example.needs if not importable(args.python, m)]
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
