#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels scripts/gpu_check.sh needs on a GPU machine
# that has CuPy, onnxruntime, numpy and pytest but not the server's other dependencies and no
# package registry: CPython 3.12, manylinux x86-64, the versions this checkout's .venv runs
# (grpcio and protobuf too, since the generated gRPC code checks their versions; msgspec and
# uvloop for the front end <-> executor seam; onnx, which
# gpu_tests/test_cuda_executor.py builds its model with). Run here,
# where PyPI is reachable; then carry .whl along with the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
version() { "$PYTHON" -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir .whl
for name in tornado orjson msgspec uvloop psutil ml-dtypes grpcio grpcio-health-checking protobuf onnx; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl "$name==$(version "$name")"
done
ls -l .whl
