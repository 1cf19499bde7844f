"""Imports go one way: protocol knows no transport, transports know no backend, backends know
no transport or repository, and nothing in the domain imports Tornado or grpc."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tests.server_process import ROOT

# package prefix -> module prefixes it must not import
_FORBIDDEN = {
    "server/protocol": ("tornado", "grpc", "server.http", "server.repository", "backends"),
    "server/repository": ("tornado", "grpc", "server.http"),
    "server/scheduling": ("tornado", "grpc", "server.http", "server.repository"),
    "server/memory": ("tornado", "grpc", "server.http", "backends"),
    # a client: it speaks the protocol and knows nothing of the server's insides
    "server/loadtest": (
        "tornado", "backends", "onnxruntime", "server.http", "server.grpc", "server.repository",
        "server.dataplane", "server.scheduling",
    ),
    "server/http": ("backends", "onnxruntime", "grpc", "server.grpc"),
    # gRPC is served on the loop by server.grpc.connection: grpcio's server is not used
    "server/grpc": ("backends", "onnxruntime", "grpc", "h2", "server.http"),
    "server/errors.py": ("tornado", "grpc"),
    # read by the command line, which the supervisor runs
    "server/restricted.py": ("tornado", "grpc", "server.http", "server.grpc"),
    "server/tls.py": ("tornado", "grpc", "server.http", "server.grpc"),
    "server/dataplane.py": ("tornado", "grpc", "backends", "onnxruntime"),
    "backends": ("tornado", "grpc", "server.http", "server.repository", "server.dataplane"),
    # starts children as fresh interpreters: never holds grpc's threads or a CUDA context
    "server/processes/supervisor.py": (
        "tornado", "grpc", "cupy", "onnxruntime", "backends", "server.app", "server.http",
        "server.grpc", "server.dataplane", "server.repository",
    ),
    "server/processes/child.py": ("tornado", "grpc", "cupy", "onnxruntime", "backends"),
}


def _imports(path: Path) -> set[str]:
    """Every module ``path`` may import: ``import a.b``, ``from a import b`` (``a`` and
    ``a.b``: ``b`` may be a module) and relative imports resolved against its package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            module = importlib.util.resolve_name(base, package) if node.level else base
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _files(prefix: str) -> list[Path]:
    target = ROOT / prefix
    return [target] if target.is_file() else sorted(target.rglob("*.py"))


@pytest.mark.parametrize("prefix", sorted(_FORBIDDEN))
def test_layer_imports(prefix: str) -> None:
    files = _files(prefix)
    assert files, prefix
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in sorted(_imports(path))
        if any(name == f or name.startswith(f + ".") for f in _FORBIDDEN[prefix])
    ]
    assert not bad, bad
