"""Regenerate the Python protobuf modules in ``server/generated`` from ``protos/*.proto``.

Runs ``grpc_tools.protoc`` (grpcio-tools) once per proto file, emitting ``*_pb2.py``
and ``*_pb2.pyi`` (plus ``*_pb2_grpc.py`` for files that declare a service), then
rewrites top-level imports of sibling generated modules into package-relative imports
so the modules work inside the ``server.generated`` package.

Usage::

    python scripts/gen_protos.py [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO_ROOT / "protos"
DEFAULT_OUT = REPO_ROOT / "server" / "generated"
INIT_TEXT = '"""Generated protobuf modules; regenerate with scripts/gen_protos.py, never edit."""\n'
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")

_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_SERVICE_RE = re.compile(r"^\s*service\s+\w+\s*\{", re.MULTILINE)
_IMPORT_RE = re.compile(r"^import (\w+_pb2(?:_grpc)?) as (\w+)$", re.MULTILINE)


def defines_service(proto: Path) -> bool:
    """Return True if the proto file declares at least one gRPC service."""
    text = _COMMENT_RE.sub("", proto.read_text(encoding="utf-8"))
    return _SERVICE_RE.search(text) is not None


def run_protoc(proto: Path, out_dir: Path) -> None:
    """Compile one proto file into ``out_dir`` with grpc_tools.protoc."""
    args = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    if defines_service(proto):
        args.append(f"--grpc_python_out={out_dir}")
    args.append(str(proto))
    subprocess.run(args, check=True, cwd=REPO_ROOT)


def make_imports_relative(path: Path, siblings: set[str]) -> None:
    """Turn ``import X_pb2 as Y`` into ``from . import X_pb2 as Y`` for sibling modules."""
    text = path.read_text(encoding="utf-8")

    def repl(match: re.Match[str]) -> str:
        module, alias = match.group(1), match.group(2)
        if module not in siblings:
            return match.group(0)
        return f"from . import {module} as {alias}"

    new_text = _IMPORT_RE.sub(repl, text)
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")


def generate(out_dir: Path) -> list[Path]:
    """Regenerate all modules into ``out_dir``; return the generated file paths."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files found in {PROTO_DIR}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        if stale.is_file() and stale.name.endswith(GENERATED_SUFFIXES):
            stale.unlink()
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text(INIT_TEXT, encoding="utf-8")
    for proto in protos:
        run_protoc(proto, out_dir)
    generated = sorted(p for p in out_dir.iterdir() if p.name.endswith(GENERATED_SUFFIXES))
    siblings = {p.name.split(".", 1)[0] for p in generated}
    for path in generated:
        make_imports_relative(path, siblings)
    return generated


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output package directory (default: server/generated)",
    )
    args = parser.parse_args(argv)
    out_dir: Path = args.out.resolve()
    for path in generate(out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
